"""PostgreSQL's twins of the SQLite-only storage tests: its write lock, its busy and full
states, its foreign keys in a migration; and the settings that keep a frozen node from holding
the write lock."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import exc, make_url, text

from gpumux.storage.dialects.postgresql import (
    KEEPALIVE_COUNT,
    KEEPALIVE_IDLE_S,
    KEEPALIVE_INTERVAL_S,
    WRITE_LOCK_KEY,
    session_settings,
)
from gpumux.storage.engine import WRITE_OPTION, Sessions, make_engine, make_sessions
from gpumux.storage.models import Owner

# A daemon's write transaction that stops between two statements: it takes the write lock,
# writes, says so, then waits for a line on stdin before it commits.
FROZEN_WRITER = """
import sys
from sqlalchemy import exc
from gpumux.storage.dialects import postgresql
from gpumux.storage.engine import make_engine, make_sessions
from gpumux.storage.models import Owner

postgresql.IDLE_IN_TRANSACTION_TIMEOUT_MS = int(sys.argv[2])
sessions = make_sessions(make_engine(sys.argv[1]))
try:
    with sessions.write.begin() as session:
        session.add(Owner(name="frozen"))
        session.flush()
        print("locked", flush=True)
        sys.stdin.readline()
except exc.DBAPIError as error:
    unreachable = sessions.dialect.is_unreachable(error)
    print("refused", getattr(error.orig, "sqlstate", None), unreachable, flush=True)
    sys.exit(3)
print("committed", flush=True)
"""
# The frozen writer's idle timeout: short, so that the test waits little for the lock.
FROZEN_IDLE_MS = 1000
WORKTREE = Path(__file__).resolve().parents[2]


@pytest.fixture
def pg_sessions(pg_migrated_database: str) -> Sessions:
    """Sessions over a fresh PostgreSQL database at head."""
    return make_sessions(make_engine(pg_migrated_database))


def other_connection(url: str) -> psycopg.Connection[tuple[object, ...]]:
    """A second client of the same database, outside gpumux's engine."""
    parsed = make_url(url)
    return psycopg.connect(
        host=str(parsed.query["host"]), dbname=parsed.database, user=parsed.username
    )


def test_a_write_session_takes_the_write_lock_when_it_begins_and_a_read_one_does_not(
    pg_sessions: Sessions, pg_migrated_database: str
) -> None:
    with other_connection(pg_migrated_database) as other:

        def lock_is_free() -> bool:
            free = other.execute("SELECT pg_try_advisory_xact_lock(%s)", (WRITE_LOCK_KEY,))
            taken = free.fetchone()
            other.rollback()
            return taken == (True,)

        with pg_sessions.read.begin() as session:
            session.execute(text("SELECT count(*) FROM sweeps"))
            assert lock_is_free()
        with pg_sessions.write.begin() as session:
            session.execute(text("SELECT count(*) FROM sweeps"))
            assert not lock_is_free()
        assert lock_is_free()
    pg_sessions.engine.dispose()


def test_a_write_lock_held_past_the_timeout_is_busy_not_full(
    pg_sessions: Sessions, pg_migrated_database: str
) -> None:
    dialect = pg_sessions.dialect
    with other_connection(pg_migrated_database) as other:
        other.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK_KEY,))
        with pg_sessions.engine.connect() as connection:
            # Not the 30 s every connection waits: the test need not wait that long.
            connection.exec_driver_sql("SET lock_timeout = 200")
            connection.commit()
            writer = connection.execution_options(**{WRITE_OPTION: True})
            with pytest.raises(exc.OperationalError) as refused:
                writer.begin()
            connection.rollback()
            connection.exec_driver_sql("RESET lock_timeout")
            connection.commit()
        other.rollback()
    assert dialect.is_busy(refused.value) and not dialect.is_full(refused.value)
    assert not dialect.is_unreachable(refused.value)
    assert dialect.busy_timeout_s == 30
    pg_sessions.engine.dispose()


def test_a_migration_that_leaves_a_dangling_reference_fails_and_keeps_nothing(
    pg_sessions: Sessions,
) -> None:
    with pg_sessions.engine.connect() as connection:
        with pytest.raises(exc.IntegrityError, match="foreign key"):
            with pg_sessions.dialect.migrating(connection):
                connection.execute(
                    text(
                        "INSERT INTO trial_reports (trial_id, attempt, kind, at, metrics) "
                        "VALUES (999, 1, 'epoch', now(), '{}')"
                    )
                )
    with pg_sessions.read() as session:
        assert session.execute(text("SELECT count(*) FROM trial_reports")).scalar() == 0
    pg_sessions.engine.dispose()


def test_a_statement_the_server_refuses_for_want_of_room_is_full_not_busy(
    pg_sessions: Sessions,
) -> None:
    # A cluster's disk cannot be filled here; the server's own disk_full state, raised where a
    # write would meet it, is what the dialect must tell apart.
    with pg_sessions.engine.connect() as connection, pytest.raises(exc.DBAPIError) as refused:
        connection.exec_driver_sql(
            "DO $$ BEGIN RAISE EXCEPTION 'no room' USING ERRCODE = 'disk_full'; END $$"
        )
    dialect = pg_sessions.dialect
    assert dialect.is_full(refused.value) and not dialect.is_busy(refused.value)
    pg_sessions.engine.dispose()


def test_a_connection_the_server_cut_is_unreachable_and_the_pool_replaces_it(
    pg_sessions: Sessions, pg_migrated_database: str
) -> None:
    dialect = pg_sessions.dialect
    with pg_sessions.engine.connect() as connection:
        pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        connection.commit()
        with other_connection(pg_migrated_database) as other:
            other.execute("SELECT pg_terminate_backend(%s)", (pid,))
            other.commit()
        with pytest.raises(exc.DBAPIError) as cut:
            connection.exec_driver_sql("SELECT 1")
    assert dialect.is_unreachable(cut.value)
    assert not dialect.is_busy(cut.value) and not dialect.is_full(cut.value)
    # The next session gets a live connection (pre-ping), not the cut one.
    with pg_sessions.read() as session:
        assert session.execute(text("SELECT count(*) FROM sweeps")).scalar() == 0
    pg_sessions.engine.dispose()


def test_every_connection_ends_idle_transactions_and_probes_its_peer(
    pg_sessions: Sessions,
) -> None:
    with pg_sessions.engine.connect() as connection:
        from_client = connection.exec_driver_sql(
            "SELECT lower(name) FROM pg_settings WHERE source = 'client'"
        )
        accepted = set(from_client.scalars())
        shown = {
            name: connection.exec_driver_sql(f"SHOW {name}").scalar()
            for name in ("lock_timeout", "idle_in_transaction_session_timeout", "timezone")
        }
        driver = connection.connection.driver_connection
        assert driver is not None
        client = driver.info.get_parameters()
    # All taken from the startup packet; on a Unix socket (the test cluster's) the server has no
    # keepalives and shows them as 0, so only their source tells.
    assert {name for name, _ in session_settings()} <= accepted
    assert shown == {
        "lock_timeout": "30s",
        "idle_in_transaction_session_timeout": "10s",
        "timezone": "UTC",
    }
    assert (client["keepalives"], client["keepalives_idle"]) == ("1", str(KEEPALIVE_IDLE_S))
    assert client["keepalives_interval"] == str(KEEPALIVE_INTERVAL_S)
    assert client["keepalives_count"] == str(KEEPALIVE_COUNT)
    pg_sessions.engine.dispose()


def read_line(child: subprocess.Popen[str], *, within: float) -> str:
    """The child's next line of output ("" once it has ended), waited for at most `within` s."""
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], within)
    assert ready, f"no output from the child within {within} s"
    return child.stdout.readline().strip()


def test_a_frozen_node_inside_a_write_transaction_loses_the_write_lock_and_its_writes(
    pg_sessions: Sessions, pg_migrated_database: str
) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", FROZEN_WRITER, pg_migrated_database, str(FROZEN_IDLE_MS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(WORKTREE)},
    ) as child:
        try:
            assert read_line(child, within=60) == "locked"
            child.send_signal(signal.SIGSTOP)
            # The server ends the frozen writer's session after its idle timeout, well before
            # lock_timeout (30 s) would fail this writer as busy.
            started = time.monotonic()
            with pg_sessions.write.begin() as session:
                waited = time.monotonic() - started
                session.add(Owner(name="awake"))
            child.send_signal(signal.SIGCONT)
            assert child.stdin is not None
            child.stdin.write("commit\n")
            child.stdin.flush()
            refused = read_line(child, within=60)
            assert child.wait(timeout=60) == 3, refused
        finally:
            # A no-op once it has been reaped.
            child.send_signal(signal.SIGCONT)
            child.kill()
    # Ended by the server (idle_in_transaction_session_timeout), a connection gpumux replaces.
    assert refused == "refused 25P03 True"
    with pg_sessions.read() as session:
        names = session.execute(text("SELECT name FROM owners")).scalars().all()
    assert "frozen" not in names and "awake" in names, f"the lock came after {waited:.1f} s"
    pg_sessions.engine.dispose()
