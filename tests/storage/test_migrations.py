"""The schema's migrations: they match the models, run once, and refuse what they cannot read."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text

from gpumux.storage.dialects.base import DatabaseError
from gpumux.storage.engine import Sessions, make_engine
from gpumux.storage.migrate import upgrade
from gpumux.storage.models import Base


def test_the_models_match_the_migrations(sessions: Sessions) -> None:
    with sessions.engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == [], f"models and migrations differ; write a migration: {diff}"


def test_upgrade_is_idempotent(sessions: Sessions) -> None:
    upgrade(sessions.engine)
    with sessions.read() as session:
        assert session.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0003"


def test_a_database_from_a_newer_gpumux_is_refused(sessions: Sessions) -> None:
    with sessions.write.begin() as session:
        session.execute(text("UPDATE alembic_version SET version_num = 'fffffffffff'"))
    with pytest.raises(DatabaseError, match="newer than this gpumux knows"):
        upgrade(sessions.engine)


def test_a_file_that_is_not_a_database_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "broken.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(DatabaseError, match="cannot be opened as a database") as caught:
        upgrade(make_engine(f"sqlite:///{path}"))
    assert str(path) in str(caught.value) and "--db" in str(caught.value)
