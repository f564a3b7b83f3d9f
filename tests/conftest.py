"""Shared fixtures: a migrated SQLite file per test, settings pointing into tmp_path."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from builders import bearer, served

from gpumux.config import Settings
from gpumux.server.api import create_app
from gpumux.storage.engine import Sessions, make_engine, make_sessions
from gpumux.storage.migrate import upgrade

FIXTURES = Path(__file__).parent / "fixtures"
# Set by .ci/run for the tests themselves (where the browser test leaves its screenshot).
FOR_THE_TESTS = {"GPUMUX_ARTIFACTS"}


@pytest.fixture(autouse=True)
def _no_gpumux_settings_of_the_developer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's own GPUMUX_* settings (their database, their daemon's URL) reach no test."""
    for name in list(os.environ):
        if name.startswith("GPUMUX_") and name not in FOR_THE_TESTS:
            monkeypatch.delenv(name)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings whose data directory is this test's own."""
    return Settings(home=tmp_path / "home", kill_grace=2.0, poll_interval=0.2)


@pytest.fixture
def sessions(settings: Settings) -> Iterator[Sessions]:
    """Sessions over a freshly migrated database file."""
    settings.home.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.database_url)
    upgrade(engine)
    yield make_sessions(engine)
    engine.dispose()


@pytest.fixture
def api(settings: Settings, sessions: Sessions) -> Iterator[httpx.Client]:
    """A client of the API served by uvicorn on a real TCP socket (no scheduler behind it),
    carrying a token of the user running the tests."""
    app = create_app(settings=settings, sessions=sessions)
    with served(app, bearer(sessions)) as client:
        yield client
