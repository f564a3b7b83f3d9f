"""PostgreSQL's migration lock: a daemon that finds another's migration under way waits for it,
saying so, and then reads the revision again; one that waits too long gives up, naming the
session that holds the lock; none keeps the lock once it has migrated."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from alembic import command
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from postgres import Cluster
from sqlalchemy import Engine

from gpumux.storage.dialects.base import DatabaseError
from gpumux.storage.dialects.postgresql import MIGRATION_LOCK_KEY
from gpumux.storage.engine import make_engine
from gpumux.storage.migrate import alembic_config, upgrade

DEADLINE_S = 30.0
POLL_S = 0.05
LOCKS = (
    "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
    "WHERE d.datname = current_database() AND l.locktype = 'advisory' AND l.objsubid = 1 "
    "AND (l.classid::bigint << 32 | l.objid::bigint) = %s AND {granted}"
)


@pytest.fixture
def engine(pg_database: str) -> Iterator[Engine]:
    """An engine over an empty database on the throwaway cluster."""
    engine = make_engine(pg_database)
    yield engine
    engine.dispose()


@pytest.fixture
def superuser(pg_cluster: Cluster, engine: Engine) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection of the superuser to the engine's database."""
    assert engine.url.database is not None
    with pg_cluster.connect(engine.url.database) as connection:
        yield connection


def migration_locks(superuser: psycopg.Connection[Any], *, granted: bool) -> int:
    """How many sessions of the database hold (or wait for) the migration lock."""
    query = LOCKS.format(granted="l.granted" if granted else "NOT l.granted")
    row = superuser.execute(query.encode(), (MIGRATION_LOCK_KEY,)).fetchone()
    return int(row[0]) if row else 0


def test_a_node_waits_for_another_nodes_migration_and_then_finds_the_schema_current(
    engine: Engine,
    superuser: psycopg.Connection[Any],
    pg_database: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gpumux")
    other = make_engine(pg_database)
    failures: list[BaseException] = []
    with other.connect() as migrator:
        # Another node's migration: the lock taken, then the scripts run on its connection.
        migrator.exec_driver_sql(f"SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})")
        migrator.commit()

        def start() -> None:
            try:
                upgrade(engine)
            except BaseException as error:  # noqa: BLE001 - reported by the test's thread
                failures.append(error)

        waiter = threading.Thread(target=start)
        waiter.start()
        deadline = time.monotonic() + DEADLINE_S
        while migration_locks(superuser, granted=False) == 0:
            assert time.monotonic() < deadline and waiter.is_alive(), failures
            time.sleep(POLL_S)
        command.upgrade(alembic_config(other, migrator), "head")
        migrator.exec_driver_sql(f"SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})")
        migrator.commit()
        waiter.join(DEADLINE_S)
    other.dispose()

    assert not waiter.is_alive() and failures == []
    messages = [record.getMessage() for record in caplog.records]
    assert any("waiting for another node's migration" in m for m in messages), messages
    assert not any("upgrading schema" in m for m in messages), messages
    with engine.connect() as connection:
        head = ScriptDirectory.from_config(alembic_config(engine)).get_current_head()
        assert MigrationContext.configure(connection).get_current_revision() == head
    assert migration_locks(superuser, granted=True) == 0


def test_a_node_gives_up_on_a_migration_that_takes_too_long_naming_the_holder(
    engine: Engine, superuser: psycopg.Connection[Any], pg_cluster: Cluster
) -> None:
    assert engine.url.database is not None
    with pg_cluster.connect(engine.url.database) as hung:
        hung.execute(f"SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})".encode())
        started = time.monotonic()
        with pytest.raises(DatabaseError) as refused:
            upgrade(engine, lock_wait_s=1.0)
        waited = time.monotonic() - started
        holder = hung.info.backend_pid
    message = str(refused.value)
    assert "another node has been migrating the schema for over 1 s" in message
    assert f"held by server pid {holder}" in message
    assert f"SELECT pg_terminate_backend({holder})" in message
    assert waited >= 1.0
    # Nothing was migrated, and the lock it waited for is not left waited for.
    assert migration_locks(superuser, granted=False) == 0
    with engine.connect() as connection:
        assert MigrationContext.configure(connection).get_current_revision() is None


def test_a_node_lets_the_migration_lock_go_once_the_schema_is_current(
    engine: Engine, superuser: psycopg.Connection[Any]
) -> None:
    upgrade(engine)
    # Its pooled connection held it: none may keep it for the daemon's life.
    assert migration_locks(superuser, granted=True) == 0
    upgrade(engine)
    assert migration_locks(superuser, granted=True) == 0
