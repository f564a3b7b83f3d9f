from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from builders import bearer, problem, served, sweep_body
from sqlalchemy import event, text

from gpumux.config import Settings
from gpumux.schemas.common import FieldProblem, Problem
from gpumux.server.api import create_app, errors
from gpumux.storage.dialects.sqlite import BUSY_TIMEOUT_MS
from gpumux.storage.engine import Sessions

# Larger than any SQLite build allows: SQLite lowers it to its own maximum.
NO_PAGE_LIMIT = 2**32

pytestmark = pytest.mark.sqlite_only(reason="fills, locks and breaks an SQLite file")


@dataclass
class Limits:
    """What each connection is held to when the API takes it from the pool."""

    max_page_count: int = NO_PAGE_LIMIT
    busy_timeout_ms: int = BUSY_TIMEOUT_MS


@pytest.fixture
def limits(sessions: Sessions) -> Limits:
    """Limits applied to every connection of the test's engine as it is checked out."""
    limits = Limits()

    def apply(dbapi_connection: sqlite3.Connection, *_: Any) -> None:
        # max_page_count: SQLite refuses to grow the file past it with SQLITE_FULL, the very
        # error a full disk gives.
        dbapi_connection.execute(f"PRAGMA max_page_count={limits.max_page_count}")
        dbapi_connection.execute(f"PRAGMA busy_timeout={limits.busy_timeout_ms}")

    event.listen(sessions.engine, "checkout", apply)
    return limits


@pytest.fixture
def api(settings: Settings, sessions: Sessions, limits: Limits) -> Iterator[httpx.Client]:
    """A client of the API as the daemon builds it (error handlers included), on a socket."""
    app = create_app(settings=settings, sessions=sessions)
    with served(app, bearer(sessions)) as client:
        yield client


def stored(api: httpx.Client) -> dict[int, list[dict[str, Any]]]:
    """Every stored sweep's trials' params, by sweep id."""
    sweeps = api.get("/sweeps").json()["data"]
    return {
        sweep["id"]: [
            trial["params"]
            for trial in api.get(f"/sweeps/{sweep['id']}/trials", params={"limit": 1000}).json()[
                "data"
            ]
        ]
        for sweep in sweeps
    }


def test_a_full_disk_answers_507_keeps_what_was_stored_and_recovers_when_space_is_freed(
    api: httpx.Client,
    sessions: Sessions,
    limits: Limits,
    settings: Settings,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    database = settings.home / "gpumux.db"
    for _ in range(2):
        assert api.post("/sweeps", json=sweep_body(tmp_path, "x=1..20")).status_code == 201
    before = stored(api)
    with sessions.read() as session:
        limits.max_page_count = session.execute(text("PRAGMA page_count")).scalar_one()

    full = api.post("/sweeps", json=sweep_body(tmp_path, "x=1..1000"))

    detail = problem(full, 507).detail
    assert f"the database {database} is full" in detail
    assert "nothing of this request was stored" in detail and "Free space" in detail
    assert f"db {database}: full; POST /sweeps refused" in caplog.text
    assert stored(api) == before and [len(params) for params in before.values()] == [20, 20]

    limits.max_page_count = NO_PAGE_LIMIT
    landed = api.post("/sweeps", json=sweep_body(tmp_path, "x=1..1000"))
    assert landed.status_code == 201, landed.text
    after = stored(api)
    assert len(after[landed.json()["id"]]) == 1000
    assert {key: after[key] for key in before} == before


def test_a_database_locked_past_the_busy_timeout_answers_503_with_retry_after(
    api: httpx.Client, limits: Limits, settings: Settings, tmp_path: Path
) -> None:
    database = settings.home / "gpumux.db"
    limits.busy_timeout_ms = 0
    blocker = sqlite3.connect(database, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        locked = api.post("/sweeps", json=sweep_body(tmp_path, "x=1,2"))
        assert locked.headers["retry-after"] == str(errors.RETRY_AFTER_S)
        detail = problem(locked, 503).detail
        assert f"the database {database} is locked by another writer" in detail
        assert "nothing of this request was stored" in detail
        # WAL: readers go on while the writer holds the lock.
        assert api.get("/sweeps").json()["count"] == 0
    finally:
        blocker.close()
    assert api.post("/sweeps", json=sweep_body(tmp_path, "x=1,2")).status_code == 201
    assert api.get("/sweeps").json()["count"] == 1


def test_any_other_database_error_answers_500_without_the_drivers_message_which_is_logged(
    api: httpx.Client, sessions: Sessions, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with sessions.write.begin() as session:
        session.execute(
            text(
                "CREATE TRIGGER refuse BEFORE INSERT ON sweeps "
                "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
            )
        )

    failed = api.post("/sweeps", json=sweep_body(tmp_path, "x=1,2"))

    detail = problem(failed, 500).detail
    assert detail == (
        f"the database {sessions.dialect.label} failed to answer POST /sweeps: its error is in "
        "the daemon's log; try again, and report it if it happens again"
    )
    (record,) = [r for r in caplog.records if r.name == "gpumux.server.api.errors"]
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert "Traceback" in caplog.text and "refused by the test" in caplog.text
    assert api.get("/health").json()["status"] == "ok"


def test_a_refused_field_is_named_in_the_problem_shape_and_its_value_never_echoed(
    api: httpx.Client, tmp_path: Path
) -> None:
    secret = "NEVER-ECHOED-" * 40
    sent = {**sweep_body(tmp_path), "name": secret, "command": [], "trials": 0}

    refused = problem(api.post("/sweeps", json=sent), 422)

    assert refused.detail.startswith("3 fields refused: body.name: String should have at most ")
    assert {tuple(field.loc) for field in refused.errors} == {
        ("body", "name"),
        ("body", "command"),
        ("body", "trials"),
    }
    assert {field.type for field in refused.errors} == {
        "string_too_long",
        "too_short",
        "greater_than_equal",
    }
    assert "NEVER-ECHOED" not in api.post("/sweeps", json=sent).text
    assert stored(api) == {}


def test_a_body_with_a_mistake_in_every_item_gets_a_bounded_answer(
    api: httpx.Client, tmp_path: Path
) -> None:
    # Under the count of parameters a sweep may have, each of the wrong type.
    sent = {**sweep_body(tmp_path), "params": list(range(200))}

    refused = problem(api.post("/sweeps", json=sent), 422)

    assert len(refused.errors) == errors.LISTED
    assert refused.detail.startswith("200 fields refused: body.params.0: Input should be a valid")
    assert refused.detail.endswith("; and 197 more")
    assert len(refused.detail.split("; ")) == errors.NAMED_IN_DETAIL + 1


@pytest.mark.parametrize(
    ("content", "msg"),
    [
        (b'{"command": ["x"], "workdir": ', "not valid JSON: Expecting value at character 30"),
        (b'{"command": ["\xff"], "workdir": "/"}', "not valid JSON: it is not UTF-8 text"),
        (b"[" * 100_000, "not valid JSON: it is nested too deeply"),
    ],
)
def test_a_body_that_is_not_json_is_a_422_in_the_problem_shape(
    api: httpx.Client, content: bytes, msg: str
) -> None:
    sent = api.post("/sweeps", content=content, headers={"content-type": "application/json"})
    refused = problem(sent, 422)
    assert refused.errors == [FieldProblem(loc=["body"], msg=msg, type="json_invalid")]
    assert refused.detail == f"1 field refused: body: {msg}"


def test_a_refusal_of_a_route_is_a_problem_without_fields(api: httpx.Client) -> None:
    assert problem(api.get("/sweeps/999"), 404) == Problem(detail="sweep 999 not found")
    anonymous = api.get("/sweeps", headers={"authorization": ""})
    assert problem(anonymous, 401).detail.startswith("over TCP every request needs a token")


def test_a_bug_answers_500_in_the_problem_shape_and_its_traceback_goes_to_the_log(
    settings: Settings, sessions: Sessions, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(settings=settings, sessions=sessions)

    @app.get("/sweeps/{name}/boom")
    def boom(name: str) -> None:
        raise RuntimeError("internals: /secret/path")

    with served(app) as client:
        # The path as the server decodes it holds a line break: the log line shows it escaped.
        failed = problem(client.get("/sweeps/7%0Aforged/boom"), 500)
        assert client.get("/health").json()["status"] == "ok"

    assert failed.detail.startswith("the daemon failed to answer GET /sweeps/{name}/boom")
    assert "secret" not in failed.model_dump_json()
    (record,) = [r for r in caplog.records if r.name == "gpumux.server.api.errors"]
    assert record.getMessage() == "api: GET /sweeps/7\\nforged/boom failed"
    assert record.exc_info is not None and "internals: /secret/path" in caplog.text


HUGE = 300_000
REPORT = {"trial_id": 1, "attempt": 1, "kind": "manual"}


@pytest.mark.parametrize(
    ("path", "sent", "loc"),
    [
        ("/sweeps", {"x" * HUGE: 1}, ["body", "x" * 64 + "…"]),
        (
            "/sweeps",
            {"env": {"\x01" + "E" * HUGE: "1"}},
            ["body", "env", "\\x01" + "E" * 63 + "…", "[key]"],
        ),
        ("/reports", {"metrics": {"m" * HUGE: 1.0}}, ["body", "metrics", "m" * 64 + "…", "[key]"]),
    ],
)
def test_a_key_of_any_length_is_named_in_a_few_hundred_characters(
    api: httpx.Client, tmp_path: Path, path: str, sent: dict[str, Any], loc: list[str]
) -> None:
    if path == "/sweeps":
        answer = api.post(path, json={**sweep_body(tmp_path), **sent})
    else:
        # Refused before the token is looked at.
        answer = api.post(path, json={**REPORT, **sent}, headers={"authorization": "Bearer no"})

    refused = problem(answer, 422)
    assert loc in [field.loc for field in refused.errors]
    assert len(answer.content) < 2_000
    assert "\x01" not in answer.text


def test_a_validators_message_is_bounded_whatever_it_quotes() -> None:
    quoted = "Value error, " + "q" * 100_000 + "\n"
    field = errors.field_problem({"loc": ("body", "name"), "msg": quoted, "type": "value_error"})
    assert field.msg == "q" * errors.MSG_CHARS + "…"


def no_busy_wait(dbapi_connection: sqlite3.Connection, *_: Any) -> None:
    dbapi_connection.execute("PRAGMA busy_timeout=0")


def test_health_tells_a_locked_database_from_an_unreadable_one(
    api: httpx.Client, limits: Limits, settings: Settings, sessions: Sessions
) -> None:
    database = settings.home / "gpumux.db"
    limits.busy_timeout_ms = 0
    # In WAL a writer lets readers on; one in exclusive locking mode shuts them out, once the
    # daemon's open connections (each holds a shared lock) are closed. A new connection then
    # fails on its first pragma, after the driver's own wait unless it is set to none first.
    sessions.engine.dispose()
    event.listen(sessions.engine, "connect", no_busy_wait, insert=True)
    blocker = sqlite3.connect(database, isolation_level=None)
    try:
        blocker.execute("PRAGMA locking_mode=EXCLUSIVE")
        blocker.execute("BEGIN EXCLUSIVE")
        locked = api.get("/health")
        detail = problem(locked, 503).detail
        assert f"the database {database} is locked by another process" in detail
        assert "stop the daemon" not in detail
        assert locked.headers["retry-after"] == str(errors.RETRY_AFTER_S)
    finally:
        blocker.close()
    assert api.get("/health").json()["status"] == "ok"

    with sessions.write.begin() as session:
        session.execute(text("ALTER TABLE trials RENAME TO trials_gone"))
    unreadable = problem(api.get("/health"), 503).detail
    assert f"the database {database} cannot be read (no such table: trials)" in unreadable
    assert "stop the daemon and start it again" in unreadable
