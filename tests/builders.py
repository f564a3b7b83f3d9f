"""Builders of test inputs, imported by tests as `from builders import ...`."""

from __future__ import annotations

import getpass
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event

from gpumux import tokenfile, tokens
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


def bearer(sessions: Sessions, user: str | None = None) -> dict[str, str]:
    """Headers carrying a fresh API token of `user` (default: whoever runs the tests)."""
    with sessions.write.begin() as session:
        token = tokens.create_token(session=session, owner_name=user or getpass.getuser())
    return {"Authorization": f"Bearer {token}"}


def daemon_token(home: Path) -> str:
    """The token a daemon keeps for its own user in its data directory."""
    token = tokenfile.read_token_file(home / tokenfile.DAEMON_TOKEN_NAME)
    assert token is not None, f"no daemon token in {home}"
    return token


def daemon_bearer(home: Path) -> dict[str, str]:
    """Headers carrying the token a daemon keeps for its own user in its data directory."""
    return {"Authorization": f"Bearer {daemon_token(home)}"}
