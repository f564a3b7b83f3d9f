"""PostgreSQL's twins of the SQLite-only storage tests: its write lock, its busy and full
states, its foreign keys in a migration."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import exc, make_url, text

from gpumux.storage.dialects.postgresql import WRITE_LOCK_KEY
from gpumux.storage.engine import WRITE_OPTION, Sessions, make_engine, make_sessions


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
