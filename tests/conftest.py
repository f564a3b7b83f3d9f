"""Shared fixtures: a migrated SQLite file per test, settings pointing into tmp_path."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from builders import bearer

from gpumux.api import create_app
from gpumux.config import Settings
from gpumux.db import Sessions, make_engine, make_sessions, upgrade

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings whose data directory is this test's own."""
    return Settings(home=tmp_path / "home", kill_grace=2.0, poll_interval=0.2)


@pytest.fixture
def sessions(settings: Settings) -> Iterator[Sessions]:
    """Sessions over a freshly migrated database file."""
    settings.home.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.db_url)
    upgrade(engine)
    yield make_sessions(engine)
    engine.dispose()


@pytest.fixture
def api(settings: Settings, sessions: Sessions) -> Iterator[httpx.Client]:
    """A client of the API served by uvicorn on a real TCP socket (no scheduler behind it),
    carrying a token of the user running the tests."""
    app = create_app(settings=settings, sessions=sessions)
    headers = bearer(sessions)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])))
    thread.start()
    port = sock.getsockname()[1]
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10, headers=headers) as client:
        yield client
    server.should_exit = True
    thread.join()
    sock.close()
