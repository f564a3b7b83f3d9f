"""The `gpumux` command line: talks to the daemon over HTTP, or runs an embedded one."""

from __future__ import annotations

from gpumux.cli.app import app, main

__all__ = ["app", "main"]
