"""The REST API: create_app() wires the routers to the settings, the sessions and the scheduler."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI

from gpumux import __version__
from gpumux.api import devices, health, profiles, reports, sweeps, trials
from gpumux.api.deps import AppState
from gpumux.config import Settings
from gpumux.db import Sessions
from gpumux.devices import DeviceSnapshot


def create_app(
    *,
    settings: Settings,
    sessions: Sessions,
    devices_view: Callable[[], list[DeviceSnapshot]] = list,
    notify: Callable[[], None] = lambda: None,
) -> FastAPI:
    """The API over this database; `notify` nudges the scheduler after a write of intent."""
    app = FastAPI(
        title="gpumux",
        version=__version__,
        description="Hyper-parameter sweeps packed onto every device of a host.",
    )
    app.state.gpumux = AppState(
        settings=settings, sessions=sessions, devices_view=devices_view, notify=notify
    )
    for module in (sweeps, trials, reports, devices, profiles, health):
        app.include_router(module.router)
    return app
