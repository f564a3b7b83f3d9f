"""The schema's Alembic migrations: where they are, and the upgrade a daemon runs at start.

Alembic is imported only to migrate a database of an earlier gpumux, or one whose tables have
no revision recorded, or to refuse a revision this gpumux does not know. A database at the head
revision, as every daemon's but the first start's is, is checked without it, and a new one
(no table) is made from the models at once and recorded at head: importing Alembic and running
the 16 migrations from nothing took 0.3 s of CPU of every new data directory's first daemon
start, the models' tables 0.015 s (docs/benchmarks.md, "The test suite").
tests/storage/test_migrations.py checks that the two make the same schema.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    exc,
    inspect,
    select,
)

from gpumux.storage.dialects import dialect_for
from gpumux.storage.dialects.base import MIGRATION_LOCK_WAIT_S, DatabaseError
from gpumux.storage.models import Base

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger(__name__)

# Where Alembic keeps a database's revision, as Alembic defines it.
VERSION_TABLE = Table(
    "alembic_version",
    MetaData(),
    Column("version_num", String(32), nullable=False),
    PrimaryKeyConstraint("version_num", name="alembic_version_pkc"),
)


def migrations_dir() -> Path:
    """The Alembic scripts: inside the installed wheel, or migrations/ of a source checkout."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "_migrations"
    return installed if installed.is_dir() else package.parent / "migrations"


@functools.cache
def head_revision() -> str:
    """The revision of the newest script in migrations/versions/, read from the names of the
    files without importing Alembic: each script's revision is its file name's four digits
    (tests/storage/test_migrations.py checks them against Alembic's)."""
    scripts = (migrations_dir() / "versions").glob("[0-9][0-9][0-9][0-9]_*.py")
    return max(script.name[:4] for script in scripts)


def alembic_config(engine: Engine, connection: Connection | None = None) -> Config:
    """An Alembic config that runs the scripts against this engine: on `connection` when given
    (one that holds the migration lock), else on one of its own that takes the lock."""
    from alembic.config import Config

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
            current = revision_of(connection)
            empty = current is None and not inspect(connection).get_table_names()
            # The upgrade begins its own transaction on this connection.
            connection.commit()
        except exc.DatabaseError as error:
            raise DatabaseError(dialect.open_failure(error)) from error
        if empty:
            # As a migration from nothing logs it: the schema it makes is the same.
            log.info("db %s: upgrading schema %s -> %s", dialect.label, None, "head")
            create_at_head(connection)
        elif current != head_revision():
            migrate(engine, connection, current)


def create_at_head(connection: Connection) -> None:
    """The models' tables, and Alembic's record that they are at the head revision, in one
    transaction, in a database with no table: what migrating it from nothing makes."""
    with connection.begin():
        Base.metadata.create_all(connection, checkfirst=False)
        VERSION_TABLE.create(connection)
        connection.execute(VERSION_TABLE.insert().values(version_num=head_revision()))


def revision_of(connection: Connection) -> str | None:
    """The database's schema revision, as Alembic recorded it; None for a new database."""
    if not inspect(connection).has_table(VERSION_TABLE.name):
        return None
    return connection.execute(select(VERSION_TABLE.c.version_num)).scalar()


def migrate(engine: Engine, connection: Connection, current: str | None) -> None:
    """Upgrade from `current` (None: no revision recorded) to the newest script on
    `connection`, which holds the migration lock; refuse a revision no script makes (a newer
    gpumux's)."""
    from alembic import command
    from alembic.script import ScriptDirectory

    label = dialect_for(engine.url).label
    scripts = ScriptDirectory.from_config(alembic_config(engine))
    if current is not None and current not in {
        script.revision for script in scripts.walk_revisions()
    }:
        raise DatabaseError(
            f"{label}: schema revision {current} is newer than this gpumux knows "
            f"(head {scripts.get_current_head()}); upgrade gpumux or use another database (--db)"
        )
    if current != scripts.get_current_head():
        log.info("db %s: upgrading schema %s -> %s", label, current, "head")
        command.upgrade(alembic_config(engine, connection), "head")
