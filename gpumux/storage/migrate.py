"""The schema's Alembic migrations: where they are, and the upgrade a daemon runs at start."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, exc

from gpumux.storage.dialects import dialect_for
from gpumux.storage.dialects.base import MIGRATION_LOCK_WAIT_S, DatabaseError

log = logging.getLogger(__name__)


def migrations_dir() -> Path:
    """The Alembic scripts: inside the installed wheel, or migrations/ of a source checkout."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "_migrations"
    return installed if installed.is_dir() else package.parent / "migrations"


def alembic_config(engine: Engine, connection: Connection | None = None) -> Config:
    """An Alembic config that runs the scripts against this engine: on `connection` when given
    (one that holds the migration lock), else on one of its own that takes the lock."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes["engine"] = engine
    config.attributes["connection"] = connection
    return config


def upgrade(engine: Engine, *, lock_wait_s: float = MIGRATION_LOCK_WAIT_S) -> None:
    """Bring the schema to the newest revision; refuse a damaged database, or one from a
    newer gpumux. Daemons starting together on a shared database migrate it one at a time:
    each reads the revision once it holds the migration lock (waiting up to `lock_wait_s` for
    another's migration), so that the first migrates and the others find the schema current."""
    dialect = dialect_for(engine.url)
    scripts = ScriptDirectory.from_config(alembic_config(engine))
    with contextlib.ExitStack() as held:
        try:
            connection = held.enter_context(engine.connect())
            # Before anything reads or migrates it: a damaged page found later would fail
            # requests one by one, with the daemon reporting itself healthy.
            problems = dialect.check_integrity(connection)
            if problems:
                raise DatabaseError(dialect.damage_failure(problems))
            connection.commit()
            held.enter_context(dialect.migration_lock(connection, wait_s=lock_wait_s))
            current = MigrationContext.configure(connection).get_current_revision()
            # The upgrade begins its own transaction on this connection.
            connection.commit()
        except exc.DatabaseError as error:
            raise DatabaseError(dialect.open_failure(error)) from error
        if current is not None and current not in {
            script.revision for script in scripts.walk_revisions()
        }:
            raise DatabaseError(
                f"{dialect.label}: schema revision {current} is newer than this gpumux knows "
                f"(head {scripts.get_current_head()}); upgrade gpumux or use another "
                "database (--db)"
            )
        if current != scripts.get_current_head():
            log.info("db %s: upgrading schema %s -> %s", dialect.label, current, "head")
            command.upgrade(alembic_config(engine, connection), "head")
