"""The REST API: create_app() wires the routers to the settings, the sessions and the scheduler."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI

from gpumux import __version__
from gpumux.config import Settings
from gpumux.devices.snapshot import DeviceSnapshot
from gpumux.server.api import (
    devices,
    errors,
    health,
    nodes,
    profiles,
    reports,
    sweeps,
    tokens,
    trials,
    ui,
)
from gpumux.server.api import metrics as metrics_route
from gpumux.server.api.allow import Methods
from gpumux.server.api.deps import AppState
from gpumux.server.api.forward import NodeClient
from gpumux.server.api.limits import BodyLimit
from gpumux.server.api.responses import EVERY_ROUTE, problems
from gpumux.server.metrics import Metrics
from gpumux.storage.budget import ReportBudget
from gpumux.storage.engine import Sessions
from gpumux.storage.nodes import NodeIdentity


def create_app(
    *,
    settings: Settings,
    sessions: Sessions,
    devices_view: Callable[[], list[DeviceSnapshot]] = list,
    notify: Callable[[], None] = lambda: None,
    metrics: Metrics | None = None,
    node: NodeIdentity | None = None,
    budget: ReportBudget | None = None,
    node_client: NodeClient | None = None,
) -> FastAPI:
    """The API over this database; `notify` nudges the scheduler after a write of intent.

    `metrics` is shared with the scheduler, which records its tick times in it; the app adds
    the state read at each scrape of /metrics, so one Metrics serves one app. `budget` is
    shared with the scheduler, which records the report lines trials print (default: the
    settings' own). `node_client`, which asks other nodes for their trials' logs, is the
    caller's to close (default: one of the app's own, made at its first request).
    """
    app = FastAPI(
        title="gpumux",
        version=__version__,
        description="Hyper-parameter sweeps packed onto every device of a host.",
    )
    app.state.gpumux = AppState(
        settings=settings,
        sessions=sessions,
        devices_view=devices_view,
        notify=notify,
        budget=budget or ReportBudget.of(settings),
        node=node,
        node_client=node_client or NodeClient(),
    )
    app.state.metrics = metrics or Metrics()
    app.state.metrics.collect_state(sessions=sessions, devices_view=devices_view)
    modules = (sweeps, trials, reports, devices, nodes, profiles, tokens, health, metrics_route, ui)
    for module in modules:
        app.include_router(module.router, responses=problems(*EVERY_ROUTE))
    # Each middleware added wraps those added before it: the body's size is held before OPTIONS,
    # HEAD and the routes see the request.
    app.add_middleware(Methods, router=app.router)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    errors.install(app)
    return app
