"""The schema's Alembic migrations: where they are, and the upgrade a daemon runs at start."""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, exc

from gpumux.storage.dialects import dialect_for
from gpumux.storage.dialects.base import DatabaseError

log = logging.getLogger(__name__)


def migrations_dir() -> Path:
    """The Alembic scripts: inside the installed wheel, or migrations/ of a source checkout."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "_migrations"
    return installed if installed.is_dir() else package.parent / "migrations"


def alembic_config(engine: Engine) -> Config:
    """An Alembic config that runs the scripts against this engine."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine) -> None:
    """Bring the schema to the newest revision; refuse a damaged database, or one from a
    newer gpumux."""
    dialect = dialect_for(engine.url)
    config = alembic_config(engine)
    scripts = ScriptDirectory.from_config(config)
    try:
        with engine.connect() as connection:
            # Before anything reads or migrates it: a damaged page found later would fail
            # requests one by one, with the daemon reporting itself healthy.
            problems = dialect.check_integrity(connection)
            if problems:
                raise DatabaseError(dialect.damage_failure(problems))
            current = MigrationContext.configure(connection).get_current_revision()
    except exc.DatabaseError as error:
        raise DatabaseError(dialect.open_failure(error)) from error
    if current is not None and current not in {
        script.revision for script in scripts.walk_revisions()
    }:
        raise DatabaseError(
            f"{dialect.label}: schema revision {current} is newer than this gpumux knows "
            f"(head {scripts.get_current_head()}); upgrade gpumux or use another database (--db)"
        )
    if current != scripts.get_current_head():
        log.info("db %s: upgrading schema %s -> %s", dialect.label, current, "head")
        command.upgrade(config, "head")
