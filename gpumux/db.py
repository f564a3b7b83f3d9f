"""The SQLite engine, its sessions, and the schema upgrade that runs when a daemon starts."""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, exc
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 30_000


class DatabaseError(RuntimeError):
    """The database cannot be used as it is; the message says why and what to do."""


def make_engine(url: str) -> Engine:
    """An engine whose SQLite connections use WAL, foreign keys and a busy timeout."""
    engine = create_engine(
        url,
        connect_args={"isolation_level": None, "check_same_thread": False},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        # FULL: a commit survives a power cut too; the write rate here is a few per trial.
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        # The driver's own transaction handling is off (isolation_level=None): we emit BEGIN.
        # A deferred transaction that reads and then writes fails at once with SQLITE_BUSY when
        # another writer got in between; BEGIN IMMEDIATE takes the write lock first and waits.
        immediate = connection.get_execution_options().get("immediate", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


@dataclass(frozen=True)
class Sessions:
    """Session factories: `read` for queries, `write` for anything that changes rows."""

    engine: Engine
    read: sessionmaker[Session]
    write: sessionmaker[Session]


def make_sessions(engine: Engine) -> Sessions:
    """Read and write session factories over one engine."""
    writer = engine.execution_options(immediate=True)
    return Sessions(
        engine=engine,
        read=sessionmaker(engine, expire_on_commit=False),
        write=sessionmaker(writer, expire_on_commit=False),
    )


def migrations_dir() -> Path:
    """The Alembic scripts: inside the installed wheel, or migrations/ of a source checkout."""
    package = Path(__file__).resolve().parent
    installed = package / "_migrations"
    return installed if installed.is_dir() else package.parent / "migrations"


def alembic_config(engine: Engine) -> Config:
    """An Alembic config that runs the scripts against this engine."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine) -> None:
    """Bring the schema to the newest revision; refuse a database from a newer gpumux."""
    config = alembic_config(engine)
    scripts = ScriptDirectory.from_config(config)
    try:
        with engine.connect() as connection:
            current = MigrationContext.configure(connection).get_current_revision()
    except exc.DatabaseError as error:
        raise DatabaseError(
            f"{engine.url.database} cannot be opened as a database ({error.orig}); "
            "move it aside or pass another --db"
        ) from error
    if current is not None and current not in {
        script.revision for script in scripts.walk_revisions()
    }:
        raise DatabaseError(
            f"{engine.url.database}: schema revision {current} is newer than this gpumux "
            f"knows (head {scripts.get_current_head()}); upgrade gpumux or use another --db"
        )
    if current != scripts.get_current_head():
        log.info("db %s: upgrading schema %s -> %s", engine.url.database, current, "head")
        command.upgrade(config, "head")
