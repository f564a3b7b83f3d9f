"""Dependencies shared by the routes: sessions, settings, and who is asking."""

from __future__ import annotations

import getpass
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from gpumux.config import Settings
from gpumux.db import Sessions
from gpumux.devices import DeviceSnapshot


@dataclass(frozen=True)
class AppState:
    settings: Settings
    sessions: Sessions
    devices_view: Callable[[], list[DeviceSnapshot]]
    notify: Callable[[], None]


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.gpumux
    return state


StateDep = Annotated[AppState, Depends(get_state)]


def get_read_session(state: StateDep) -> Iterator[Session]:
    with state.sessions.read() as session:
        yield session


ReadSessionDep = Annotated[Session, Depends(get_read_session)]


def get_user() -> str:
    """Who is asking: for now the daemon's own user, since one daemon serves one user."""
    return getpass.getuser()


UserDep = Annotated[str, Depends(get_user)]
