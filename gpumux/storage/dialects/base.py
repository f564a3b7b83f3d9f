"""What a database backend gives gpumux: one Dialect per kind of database, chosen by URL."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy import URL, ColumnElement, SQLColumnExpression, exc
from sqlalchemy.engine import Connection

# How long a daemon waits for another's migration of a shared database before it gives up,
# saying which session holds the lock: far longer than a migration of a real database takes.
MIGRATION_LOCK_WAIT_S = 600.0


class DatabaseError(RuntimeError):
    """The database cannot be used as it is; the message says why and what to do."""


class Dialect(ABC):
    """One kind of database behind gpumux's engine: how it connects, begins, fails and counts.

    A dialect is a value over one URL, cheap to make; `dialect_for(url)` picks the class.
    """

    # The SQLAlchemy driver names (URL schemes) this dialect serves, and one to show users.
    drivernames: ClassVar[tuple[str, ...]]
    example_url: ClassVar[str]
    # Whether daemons on several hosts may share it (then each holds a node lease, and a
    # node's supervisors stop their trials when it lapses).
    shared: ClassVar[bool]

    def __init__(self, url: URL) -> None:
        self.url = url

    @property
    @abstractmethod
    def label(self) -> str:
        """The database as messages name it (never with a password)."""

    @abstractmethod
    def lock_path(self, home: Path) -> Path:
        """The file a daemon holds locked while it owns this database (home: its data dir)."""

    @abstractmethod
    def check_location(self) -> None:
        """Refuse (DatabaseError) a database where it cannot work, before any connection."""

    @abstractmethod
    def prepare_location(self) -> None:
        """Create what the database needs before a daemon's first connection, owner-only."""

    @abstractmethod
    def engine_options(self) -> dict[str, Any]:
        """Keyword arguments for sqlalchemy.create_engine."""

    @abstractmethod
    def on_connect(self, dbapi_connection: Any) -> None:
        """Set up each new driver connection (its session settings)."""

    @abstractmethod
    def on_begin(self, connection: Connection, *, write: bool) -> None:
        """Begin a transaction, one that will write when `write` (the engine's begin event)."""

    @contextlib.contextmanager
    def migration_lock(
        self, connection: Connection, *, wait_s: float = MIGRATION_LOCK_WAIT_S
    ) -> Iterator[None]:
        """Hold the database's one migration lock on this connection (not in a transaction)
        until the block ends, waiting up to `wait_s` for another daemon's migration.

        Here nothing: a database that one daemon at a time holds (its lock file, lock_path)
        has one migrator. A shared database's dialect takes a lock on the server.
        """
        yield

    @contextlib.contextmanager
    def migrating(self, connection: Connection) -> Iterator[None]:
        """One transaction around a run of migrations, on a connection not yet in one."""
        with connection.begin():
            yield

    @abstractmethod
    def check_integrity(self, connection: Connection) -> list[str]:
        """What the database's own check finds damaged, a few lines at most; empty if intact."""

    @abstractmethod
    def damage_failure(self, problems: Sequence[str]) -> str:
        """Why a damaged database is refused, and how to get a working one back."""

    @abstractmethod
    def open_failure(self, error: exc.DatabaseError) -> str:
        """Why the database could not be opened, and what to do about it."""

    @abstractmethod
    def is_full(self, error: BaseException) -> bool:
        """Whether a statement failed because the database has no room left."""

    @abstractmethod
    def is_busy(self, error: BaseException) -> bool:
        """Whether a statement failed because another writer held a lock past the timeout."""

    @abstractmethod
    def is_unreachable(self, error: BaseException) -> bool:
        """Whether a statement failed because the database's server cannot be reached (down,
        restarting, or the connection cut): a state to wait out, not a defect."""

    @property
    @abstractmethod
    def busy_timeout_s(self) -> float:
        """How long a statement waits for another writer's lock before it fails."""

    @abstractmethod
    def seconds_between(
        self, start: SQLColumnExpression[Any], end: SQLColumnExpression[Any]
    ) -> ColumnElement[float]:
        """SQL for the seconds from one timestamp column to another."""

    @abstractmethod
    def now(self) -> ColumnElement[datetime]:
        """SQL for the database's clock now, naive UTC as timestamps are stored: the one clock
        every node's lease is measured on, whatever the nodes' own clocks say."""
