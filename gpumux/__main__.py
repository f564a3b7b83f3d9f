"""`python -m gpumux`, the same as the `gpumux` script."""

from __future__ import annotations

from gpumux.main import main

main()
