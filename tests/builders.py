"""Builders of test inputs, imported by tests as `from builders import ...`."""

from __future__ import annotations

import os
from pathlib import Path

from gpumux.schemas import SweepCreate


def sweep_in(
    workdir: Path, *params: str, command: list[str] | None = None, **fields: object
) -> SweepCreate:
    """A SweepCreate running `command` in `workdir` with this interpreter's environment."""
    return SweepCreate.model_validate(
        {
            "params": list(params),
            "command": command or ["true"],
            "workdir": str(workdir),
            "env": dict(os.environ),
            **fields,
        }
    )
