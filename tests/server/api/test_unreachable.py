"""The API while its PostgreSQL server is away, on a throwaway cluster of this module's own: every
route, /health included, answers 503 with Retry-After and says the daemon retries on its own;
once the server is back, the same requests answer 200."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from builders import bearer, problem, served, sweep_body
from postgres import Cluster, throwaway_cluster
from sqlalchemy import text

from gpumux.config import Settings
from gpumux.server.api import create_app
from gpumux.server.api.deps import get_read_session
from gpumux.server.api.errors import RETRY_AFTER_S
from gpumux.storage.engine import make_engine, make_sessions
from gpumux.storage.migrate import upgrade


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[Cluster]:
    """A cluster these tests alone use: they stop that server, which the shared one must not."""
    yield from throwaway_cluster("gpumux-pg-away-")


@pytest.fixture
def api(own_cluster: Cluster, tmp_path: Path) -> Iterator[tuple[httpx.Client, str]]:
    """A client of the API over a fresh database of `own_cluster`, and that database's label."""
    url = own_cluster.url(own_cluster.create_database())
    engine = make_engine(url)
    upgrade(engine)
    sessions = make_sessions(engine)
    app = create_app(settings=Settings(home=tmp_path / "home", database_url=url), sessions=sessions)
    with served(app, bearer(sessions)) as client:
        yield client, sessions.dialect.label
    engine.dispose()


@pytest.fixture
def halted(own_cluster: Cluster) -> Iterator[Cluster]:
    """The cluster, for a test that halts its server: resumed after the test if left halted."""
    yield own_cluster
    # The server's pid file is there while it runs (pg_ctl stop waits for it to go).
    if not (own_cluster.data / "postmaster.pid").exists():
        own_cluster.resume()


def assert_unreachable(answer: httpx.Response, label: str) -> None:
    """A 503 that names the database, says it is unreachable and why in one line, and that the
    daemon retries on its own, with Retry-After."""
    detail = problem(answer, 503).detail
    assert detail.startswith(f"the database {label} is unreachable ("), detail
    assert "the daemon retries on its own: check that the server runs" in detail, detail
    assert "\n" not in detail and "stop the daemon" not in detail, detail
    assert answer.headers["Retry-After"] == str(RETRY_AFTER_S)


def test_health_answers_503_while_the_server_is_away_and_200_once_it_is_back(
    api: tuple[httpx.Client, str], halted: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    client, label = api
    assert client.get("/health").status_code == 200
    halted.halt()
    with caplog.at_level(logging.WARNING, logger="gpumux.server.api"):
        assert_unreachable(client.get("/health"), label)
    told = [record.getMessage() for record in caplog.records]
    assert any(f"db {label}: health: unreachable: " in line for line in told), told
    assert not any("\n" in line for line in told), told
    halted.resume()
    assert client.get("/health").status_code == 200


def test_reads_and_writes_answer_503_not_500_while_the_server_is_away(
    api: tuple[httpx.Client, str], halted: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client, label = api
    assert client.get("/sweeps").status_code == 200
    halted.halt()
    with caplog.at_level(logging.WARNING, logger="gpumux.server.api"):
        assert_unreachable(client.get("/sweeps"), label)
        assert_unreachable(client.post("/sweeps", json=sweep_body(tmp_path)), label)
    told = [record.getMessage() for record in caplog.records]
    assert any(f"db {label}: unreachable; GET /sweeps refused: " in line for line in told), told
    assert not any("\n" in line for line in told), told
    halted.resume()
    listed = client.get("/sweeps")
    assert listed.status_code == 200, listed.text
    # The write refused while the server was away stored nothing.
    assert listed.json()["data"] == []


@pytest.mark.parametrize("ended", ["answered", "failed"])
def test_a_read_session_whose_server_went_away_closes_without_a_second_error(
    own_cluster: Cluster, halted: Cluster, tmp_path: Path, ended: str
) -> None:
    """A request's read session closes after its answer: a server gone since its query makes
    that close's rollback fail, which must neither replace the request's own error nor raise
    past an answer already given (uvicorn logged it as an exception in the application)."""
    url = own_cluster.url(own_cluster.create_database())
    engine = make_engine(url)
    upgrade(engine)
    sessions = make_sessions(engine)
    app = create_app(settings=Settings(home=tmp_path / "home", database_url=url), sessions=sessions)
    reading = get_read_session(app.state.gpumux)
    try:
        next(reading).execute(text("SELECT 1"))
        halted.halt()
        if ended == "answered":
            with pytest.raises(StopIteration):
                next(reading)
        else:
            failure = RuntimeError("the request failed")
            with pytest.raises(RuntimeError) as raised:
                reading.throw(failure)
            assert raised.value is failure
    finally:
        engine.dispose()
