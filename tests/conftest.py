"""Shared fixtures: a migrated SQLite file per test, settings pointing into tmp_path, and a
throwaway PostgreSQL cluster for the tests that need one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from builders import bearer, served
from postgres import SQLITE_ONLY, Cluster, on_both_backends, throwaway_cluster

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


@pytest.fixture(autouse=True)
def _gpus_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's GPUs reach no daemon or trial the tests start: expectations are written for
    the CPU device or a scripted NVML, on a GPU host too. The real-NVML tests make their probe
    themselves; a test that wants the host's GPUs through a daemon deletes the variable."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{SQLITE_ONLY}(reason): a test of SQLite itself (query plans, pragmas, its file and "
        "lock), run on SQLite alone where a directory runs its tests on both backends",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    on_both_backends(metafunc, Path(__file__).parent)


@pytest.fixture
def backend() -> str:
    """The database behind `settings`: SQLite, unless the test is of a directory run on both
    (tests/postgres.py ON_BOTH_BACKENDS)."""
    return "sqlite"


@pytest.fixture
def settings(tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> Settings:
    """Settings whose data directory is this test's own, over its own database: an SQLite file
    in that directory, or a fresh database on the throwaway PostgreSQL cluster."""
    home = tmp_path / "home"
    if backend == "postgresql":
        url = request.getfixturevalue("pg_migrated_database")
        return Settings(home=home, database_url=url, kill_grace=2.0, poll_interval=0.2)
    return Settings(home=home, kill_grace=2.0, poll_interval=0.2)


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


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """One PostgreSQL server for the whole run, on a Unix socket (skips, saying why, without)."""
    yield from throwaway_cluster("gpumux-pg-")


@pytest.fixture
def pg_database(pg_cluster: Cluster) -> Iterator[str]:
    """The URL of a new, empty database on the throwaway cluster, dropped after the test."""
    name = pg_cluster.create_database()
    yield pg_cluster.url(name)
    pg_cluster.drop_database(name)


@pytest.fixture(scope="session")
def pg_migrated_template(pg_cluster: Cluster) -> str:
    """A database migrated to head once per run, that each test's database copies."""
    name = pg_cluster.create_database()
    engine = make_engine(pg_cluster.url(name))
    upgrade(engine)
    engine.dispose()
    return name


@pytest.fixture
def pg_migrated_database(pg_cluster: Cluster, pg_migrated_template: str) -> Iterator[str]:
    """The URL of a new database already at head (a copy of the template), dropped after."""
    name = pg_cluster.create_database(template=pg_migrated_template)
    yield pg_cluster.url(name)
    pg_cluster.drop_database(name)
