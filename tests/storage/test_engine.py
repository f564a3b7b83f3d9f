"""The engine as its dialect sets it up: pragmas on every connection, writers that queue."""

from __future__ import annotations

import sqlite3
import threading

import pytest
from sqlalchemy import text

from gpumux.storage.dialects.sqlite import BUSY_TIMEOUT_MS
from gpumux.storage.engine import Sessions


@pytest.mark.sqlite_only(reason="SQLite's pragmas")
def test_connections_use_wal_foreign_keys_and_busy_timeout(sessions: Sessions) -> None:
    with sessions.read() as session:
        assert session.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert session.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert session.execute(text("PRAGMA busy_timeout")).scalar() == BUSY_TIMEOUT_MS == 30_000
        assert session.execute(text("PRAGMA synchronous")).scalar() == 2  # FULL


@pytest.mark.sqlite_only(
    reason="SQLite's file lock; tests/storage/test_postgresql.py has the advisory lock's twin"
)
def test_a_write_session_takes_the_write_lock_when_it_begins_and_a_read_one_does_not(
    sessions: Sessions,
) -> None:
    path = sessions.dialect.label
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        with sessions.read.begin() as session:
            session.execute(text("SELECT count(*) FROM sweeps"))
            other.execute("BEGIN IMMEDIATE")
            other.execute("ROLLBACK")
        with sessions.write.begin() as session:
            session.execute(text("SELECT count(*) FROM sweeps"))
            try:
                other.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as error:
                refused = str(error)
            else:
                other.execute("ROLLBACK")
                refused = ""
        assert refused == "database is locked"
    finally:
        other.close()


def test_concurrent_read_modify_write_transactions_queue_instead_of_failing(
    sessions: Sessions,
) -> None:
    with sessions.write.begin() as session:
        session.execute(text("CREATE TABLE counter (n INTEGER)"))
        session.execute(text("INSERT INTO counter VALUES (0)"))
    errors: list[BaseException] = []

    def bump() -> None:
        try:
            for _ in range(20):
                with sessions.write.begin() as session:
                    n = session.execute(text("SELECT n FROM counter")).scalar_one()
                    session.execute(text("UPDATE counter SET n = :n"), {"n": n + 1})
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with sessions.read() as session:
        assert session.execute(text("SELECT n FROM counter")).scalar_one() == 80
