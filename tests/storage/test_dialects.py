"""The dialect seam: which database a URL names, and SQLite's answers to what the engine,
the daemon and the API ask of it, each tried on a real database file."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from builders import sweep_plan
from sqlalchemy import Engine, event, select, text
from sqlalchemy.exc import OperationalError

from gpumux.config import Settings
from gpumux.status import TrialStatus
from gpumux.storage import lifecycle
from gpumux.storage import owners as owner_store
from gpumux.storage import sweeps as sweep_store
from gpumux.storage import trials as trial_store
from gpumux.storage.dialects import dialect_for
from gpumux.storage.dialects.base import DatabaseError
from gpumux.storage.dialects.sqlite import SqliteDialect
from gpumux.storage.engine import Sessions, make_engine
from gpumux.storage.migrate import upgrade
from gpumux.storage.models import Trial, utcnow


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("postgresql+psycopg2://gpumux:s3cret@db.example/gpumux", "postgresql+psycopg2"),
        ("mysql://gpumux:s3cret@db.example/gpumux", "mysql"),
        ("sqlite+pysqlcipher://:s3cret@/gpumux.db", "sqlite+pysqlcipher"),
    ],
)
def test_a_url_of_an_unknown_kind_is_refused_naming_the_supported_ones(
    url: str, named: str
) -> None:
    with pytest.raises(DatabaseError) as refused:
        dialect_for(url)
    message = str(refused.value)
    assert f"gpumux has no dialect for {named}" in message
    assert "it supports sqlite:///PATH/TO/gpumux.db" in message
    assert "GPUMUX_DATABASE_URL" in message and "GPUMUX_DB" in message
    assert "s3cret" not in message


def test_a_string_that_is_no_url_is_refused_without_echoing_it() -> None:
    with pytest.raises(DatabaseError, match="not one SQLAlchemy can read") as refused:
        dialect_for("s3cret at db.example")
    assert "s3cret" not in str(refused.value)


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file:x?uri=true"])
def test_an_sqlite_database_that_is_not_a_plain_file_is_refused(url: str) -> None:
    with pytest.raises(DatabaseError, match="gpumux keeps its state in an SQLite file"):
        dialect_for(url)


def test_an_sqlite_url_names_its_file_and_the_lock_beside_it(tmp_path: Path) -> None:
    for url in (f"sqlite:///{tmp_path}/a.db", f"sqlite+pysqlite:///{tmp_path}/a.db"):
        dialect = dialect_for(url)
        assert isinstance(dialect, SqliteDialect)
        assert dialect.label == f"{tmp_path}/a.db"
        assert dialect.lock_path(tmp_path / "home") == tmp_path / "a.db.lock"


def test_the_settings_derive_one_database_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("GPUMUX_DB", "GPUMUX_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    default = Settings(home=home)
    assert default.database_url == f"sqlite:///{home}/gpumux.db"
    assert default.database_file == home / "gpumux.db"
    monkeypatch.setenv("GPUMUX_DB", str(tmp_path / "elsewhere.db"))
    assert Settings(home=home).database_url == f"sqlite:///{tmp_path}/elsewhere.db"
    monkeypatch.delenv("GPUMUX_DB")
    monkeypatch.setenv("GPUMUX_DATABASE_URL", "postgresql+psycopg://gpumux@db/gpumux")
    server = Settings(home=home)
    assert server.database_url == "postgresql+psycopg://gpumux@db/gpumux"
    assert server.database_file is None
    with pytest.raises(ValueError, match="give --db \\(GPUMUX_DB\\) or GPUMUX_DATABASE_URL"):
        Settings(home=home, db=tmp_path / "x.db")


@pytest.mark.parametrize(
    "url",
    ["postgresql+psycopg://gpumux@db.example/gpumux", "postgresql://gpumux@db.example/gpumux"],
)
def test_gpumux_db_names_a_server_database_by_its_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    monkeypatch.setenv("GPUMUX_DB", url)
    settings = Settings(home=tmp_path)
    assert settings.database_url == url
    assert settings.database_file is None
    monkeypatch.delenv("GPUMUX_DB")
    # As --db gives it.
    assert Settings(home=tmp_path, db=url).database_url == url


def test_a_postgresql_url_without_a_driver_is_served_by_psycopg_3(pg_database: str) -> None:
    url = pg_database.replace("postgresql+psycopg://", "postgresql://", 1)
    assert dialect_for(url).url.drivername == "postgresql+psycopg"
    engine = make_engine(url)
    with engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT 1").scalar() == 1
    engine.dispose()


def test_serve_with_a_url_of_an_unknown_kind_says_so_and_creates_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {name: value for name, value in os.environ.items() if not name.startswith("GPUMUX_")}
    env.update(GPUMUX_HOME=str(home), GPUMUX_DATABASE_URL="mysql://gpumux:s3cret@db/gpumux")
    served = subprocess.run(
        [sys.executable, "-m", "gpumux", "serve"], env=env, capture_output=True, text=True
    )
    assert served.returncode == 1, served.stderr
    assert "Traceback" not in served.stderr
    assert "error: database URL mysql://gpumux:***@db/gpumux: gpumux has no dialect" in " ".join(
        served.stderr.split()
    )
    assert not home.exists()


@pytest.fixture
def page_limit(sessions: Sessions) -> Iterator[list[int]]:
    """A max_page_count applied to every connection as it is checked out, when set."""
    limit: list[int] = []

    def apply(dbapi_connection: sqlite3.Connection, *_: object) -> None:
        if limit:
            dbapi_connection.execute(f"PRAGMA max_page_count={limit[0]}")

    event.listen(sessions.engine, "checkout", apply)
    yield limit
    event.remove(sessions.engine, "checkout", apply)


def fill_until_refused(engine: Engine) -> OperationalError:
    """Write until the database refuses to grow; the error it gave."""
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE ballast (data BLOB)"))
    blob = b"\0" * 64 * 1024
    for _ in range(10_000):
        try:
            with engine.begin() as connection:
                connection.execute(text("INSERT INTO ballast VALUES (:data)"), {"data": blob})
        except OperationalError as error:
            return error
    raise AssertionError("the database never filled")


@pytest.mark.sqlite_only(
    reason="SQLite's page limit stands for a full disk; test_postgresql.py has the server's twin"
)
def test_a_database_at_its_size_limit_is_full_not_busy(
    sessions: Sessions, page_limit: list[int]
) -> None:
    with sessions.read() as session:
        page_limit.append(session.execute(text("PRAGMA page_count")).scalar_one() + 4)
    error = fill_until_refused(sessions.engine)
    assert sessions.dialect.is_full(error) and not sessions.dialect.is_busy(error)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("a full disk needs a small tmpfs, and mounting one needs root")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def test_a_database_on_a_full_disk_is_full_not_busy(small_disk: Path) -> None:
    engine = make_engine(f"sqlite:///{small_disk / 'gpumux.db'}")
    try:
        error = fill_until_refused(engine)
        dialect = dialect_for(engine.url)
        assert dialect.is_full(error) and not dialect.is_busy(error), error
    finally:
        engine.dispose()


@pytest.mark.sqlite_only(
    reason="SQLite's file lock; tests/storage/test_postgresql.py has the advisory lock's twin"
)
def test_a_write_lock_held_past_the_timeout_is_busy_not_full(sessions: Sessions) -> None:
    blocker = sqlite3.connect(sessions.dialect.label, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with sessions.engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA busy_timeout=0")
            with pytest.raises(OperationalError) as caught:
                connection.execute(text("INSERT INTO owners (name, created_at) VALUES ('x', '')"))
            connection.exec_driver_sql("ROLLBACK")
            connection.exec_driver_sql(f"PRAGMA busy_timeout={30_000}")
    finally:
        blocker.close()
    error = caught.value
    assert sessions.dialect.is_busy(error) and not sessions.dialect.is_full(error)
    assert sessions.dialect.busy_timeout_s == 30


def test_seconds_between_two_timestamps_is_computed_by_the_database(
    sessions: Sessions, tmp_path: Path
) -> None:
    start = utcnow()
    with sessions.write.begin() as session:
        owner = owner_store.get_or_create_owner(session=session, name="alice")
        sweep = sweep_store.create_sweep(
            session=session, plan=sweep_plan(tmp_path, seed=1, trial_params=[{}]), owner=owner
        )
        (trial,), _ = trial_store.list_trials(session=session, sweep_id=sweep.id)
        lifecycle.set_trial_status(
            session=session, trial=trial, status=TrialStatus.starting, started_at=start
        )
        lifecycle.set_trial_status(session=session, trial=trial, status=TrialStatus.running)
        lifecycle.set_trial_status(
            session=session,
            trial=trial,
            status=TrialStatus.succeeded,
            ended_at=start + timedelta(hours=2, seconds=3.25),
        )
    seconds = sessions.dialect.seconds_between(Trial.started_at, Trial.ended_at)
    with sessions.read() as session:
        assert session.scalar(select(seconds)) == pytest.approx(7203.25, abs=1e-3)


@pytest.mark.sqlite_only(
    reason="SQLite defers foreign keys in a migration; PostgreSQL checks them at once (its "
    "twin is in test_postgresql.py)"
)
def test_a_migration_that_leaves_a_dangling_reference_is_rolled_back(
    sessions: Sessions,
) -> None:
    with sessions.engine.connect() as connection:
        with pytest.raises(DatabaseError, match="references point nowhere"):
            with sessions.dialect.migrating(connection):
                connection.execute(
                    text(
                        "INSERT INTO trial_reports (trial_id, attempt, kind, at, metrics) "
                        "VALUES (999, 1, 'epoch', '', '{}')"
                    )
                )
        # Foreign keys are on again for the next user of this pooled connection.
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        connection.rollback()
    with sessions.read() as session:
        assert session.execute(text("SELECT count(*) FROM trial_reports")).scalar() == 0


def test_the_file_prepared_for_a_daemon_and_its_directory_are_the_owners_alone(
    tmp_path: Path,
) -> None:
    dialect = dialect_for(f"sqlite:///{tmp_path / 'new' / 'deeper' / 'gpumux.db'}")
    dialect.prepare_location()
    engine = make_engine(f"sqlite:///{dialect.label}")
    try:
        upgrade(engine)
    finally:
        engine.dispose()
    modes = {
        path.name: oct(path.stat().st_mode & 0o777)
        for path in (tmp_path / "new" / "deeper", Path(dialect.label))
    }
    assert modes == {"deeper": "0o700", "gpumux.db": "0o600"}
