"""`python -m gpumux.cli`, the same as the `gpumux` script."""

from __future__ import annotations

from gpumux.cli.app import main

main()
