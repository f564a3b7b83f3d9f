"""Tests of gpumux.runtime, the library inside trial processes."""
