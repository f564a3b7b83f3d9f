"""The engine over gpumux's database, set up by its dialect, and the sessions over it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, sessionmaker

from gpumux.storage.dialects import dialect_for
from gpumux.storage.dialects.base import Dialect

# The execution option that marks a connection whose transactions will write.
WRITE_OPTION = "gpumux_write"


def make_engine(url: str) -> Engine:
    """An engine whose connections and transactions the URL's dialect sets up.

    A database where it cannot work (an SQLite file on a network filesystem) is refused with
    DatabaseError before any connection: every user of the database gets its engine here.
    """
    dialect = dialect_for(url)
    dialect.check_location()
    # The dialect's URL: it may name the driver the given one left out.
    engine = create_engine(dialect.url, **dialect.engine_options())

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dialect.on_connect(dbapi_connection)

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        write = connection.get_execution_options().get(WRITE_OPTION, False)
        dialect.on_begin(connection, write=write)

    return engine


@dataclass(frozen=True)
class Sessions:
    """Session factories: `read` for queries, `write` for anything that changes rows."""

    engine: Engine
    dialect: Dialect
    read: sessionmaker[Session]
    write: sessionmaker[Session]


def make_sessions(engine: Engine) -> Sessions:
    """Read and write session factories over one engine."""
    writer = engine.execution_options(**{WRITE_OPTION: True})
    return Sessions(
        engine=engine,
        dialect=dialect_for(engine.url),
        read=sessionmaker(engine, expire_on_commit=False),
        write=sessionmaker(writer, expire_on_commit=False),
    )
