"""These tests run on SQLite and on PostgreSQL (those marked sqlite_only on SQLite alone)."""

from __future__ import annotations

import pytest
from postgres import on_both_backends


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    on_both_backends(metafunc)
