"""Node daemons on one PostgreSQL database: real `gpumux serve` processes, each its own home."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from reliability.conftest import DaemonProcess
from sqlalchemy import Engine

from gpumux.config import Settings
from gpumux.storage.engine import Sessions, make_engine, make_sessions
from gpumux.storage.migrate import upgrade

T = TypeVar("T")
TIMEOUT_S = 120.0
POLL_S = 0.1

NodeFactory = Callable[..., DaemonProcess]


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, settings: Settings) -> Iterator[Sessions]:
    """Sessions over a migrated database of each backend."""
    if request.param == "sqlite":
        settings.home.mkdir(parents=True, exist_ok=True)
        url = settings.database_url
    else:
        url = request.getfixturevalue("pg_database")
    engine = make_engine(url)
    upgrade(engine)
    yield make_sessions(engine)
    engine.dispose()


@pytest.fixture
def cluster_db(pg_database: str) -> Iterator[Sessions]:
    """Sessions over the shared database, for the test to watch it (the daemons migrate it)."""
    engine: Engine = make_engine(pg_database)
    yield make_sessions(engine)
    engine.dispose()


@pytest.fixture
def make_node(tmp_path: Path, pg_database: str) -> Iterator[NodeFactory]:
    """Start `gpumux serve` as node NAME on the shared database, with `env` added (launch
    only, with `serving=False`: the caller waits); all are stopped, and what they left running
    killed, at the end of the test."""
    made: list[DaemonProcess] = []

    def make(name: str, *, serving: bool = True, **env: str) -> DaemonProcess:
        daemon = DaemonProcess(
            tmp_path / name,
            env={
                "GPUMUX_DATABASE_URL": pg_database,
                "GPUMUX_NODE_NAME": name,
                "GPUMUX_POLL_INTERVAL": "0.2",
                **env,
            },
        )
        made.append(daemon)
        daemon.launch()
        if serving:
            daemon.serving()
        return daemon

    yield make
    for daemon in made:
        daemon.close()


def wait_until(what: str, condition: Callable[[], T | None], *nodes: DaemonProcess) -> T:
    """Poll `condition` until it returns something true, and return that; fail after
    TIMEOUT_S with the nodes' logs."""
    deadline = time.monotonic() + TIMEOUT_S
    while not (value := condition()):
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {n.home.name}\n{n.log_tail()}" for n in nodes)
            raise AssertionError(f"timed out waiting for {what}\n{logs}")
        time.sleep(POLL_S)
    return value
