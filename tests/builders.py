"""Builders of test inputs, imported by tests as `from builders import ...`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event

from gpumux.db import Sessions
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


@contextmanager
def selects(sessions: Sessions) -> Iterator[list[tuple[str, Any]]]:
    """The SELECT statements run on the engine inside the block, with their parameters."""
    statements: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            statements.append((statement, parameters))

    event.listen(sessions.engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(sessions.engine, "before_cursor_execute", record)
