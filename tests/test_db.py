from __future__ import annotations

import threading
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text

from gpumux.db import DatabaseError, Sessions, make_engine, make_sessions, upgrade
from gpumux.models import Base


def test_migrations_match_the_models(sessions: Sessions) -> None:
    with sessions.engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == [], f"models and migrations differ; write a migration: {diff}"


def test_connections_use_wal_foreign_keys_and_busy_timeout(sessions: Sessions) -> None:
    with sessions.read() as session:
        assert session.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert session.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert session.execute(text("PRAGMA busy_timeout")).scalar() == 30_000


def test_upgrade_is_idempotent(sessions: Sessions) -> None:
    upgrade(sessions.engine)
    with sessions.read() as session:
        assert session.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0003"


def test_a_database_from_a_newer_gpumux_is_refused(tmp_path: Path, sessions: Sessions) -> None:
    with sessions.write.begin() as session:
        session.execute(text("UPDATE alembic_version SET version_num = 'fffffffffff'"))
    with pytest.raises(DatabaseError, match="newer than this gpumux knows"):
        upgrade(sessions.engine)


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


def test_a_file_that_is_not_a_database_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "broken.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(DatabaseError, match="cannot be opened as a database") as caught:
        upgrade(make_engine(f"sqlite:///{path}"))
    assert str(path) in str(caught.value) and "--db" in str(caught.value)


def test_sessions_share_one_engine(sessions: Sessions) -> None:
    assert make_sessions(sessions.engine).engine is sessions.engine
