"""PostgreSQL, the database several nodes share: one server, reached over the network by psycopg 3.

SQLite serialises writers with one lock on its file (BEGIN IMMEDIATE); every invariant the
store keeps by reading and then writing in one transaction (a user's queue limit, the
lifecycle gate, a claim) rests on that. Here a transaction that will write takes one
transaction-scoped advisory lock first, so those invariants hold as they do on SQLite, decided
by the server; reads run beside writes under MVCC and never wait for them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    URL,
    ColumnElement,
    DateTime,
    Float,
    SQLColumnExpression,
    cast,
    exc,
    extract,
    func,
)
from sqlalchemy.engine import Connection

from gpumux.home.layout import Layout
from gpumux.storage.dialects.base import MIGRATION_LOCK_WAIT_S, DatabaseError, Dialect

log = logging.getLogger(__name__)

# The key of the advisory lock write transactions take (any constant).
WRITE_LOCK_KEY = 0x6770_756D_7578
# The key of the session-level advisory lock a daemon holds while it reads the schema's
# revision and migrates it: the only other lock gpumux takes.
MIGRATION_LOCK_KEY = WRITE_LOCK_KEY + 1
# How often a daemon waiting for another's migration says so, and who holds the lock.
MIGRATION_WAIT_REPORT_S = 10.0
# How long a statement waits for a lock (the write lock included) before it fails as busy.
LOCK_TIMEOUT_MS = 30_000
# How long a connection attempt waits for an unreachable server before it fails.
CONNECT_TIMEOUT_S = 10
# How long the server lets a session sit idle inside a transaction before it ends the session,
# rolling back and releasing what it holds (the write lock above all): a node frozen (SIGSTOP,
# a paused VM) or cut off mid-transaction must not stall every other node's lease renewal. Well
# under what a renewal may wait and still land before the supervisors' lease files lapse (the
# lease less two heartbeats: 30 - 2 x 5 = 20 s by default), and well over what gpumux does
# between two statements of one transaction (Python work: a sampler's ask, a user lookup).
IDLE_IN_TRANSACTION_TIMEOUT_MS = 10_000
# TCP keepalives, on the server for a node that vanished from the network and in libpq for a
# server that did: a dead peer is found after idle + interval x count = 25 s of silence rather
# than the system's two hours. Unix-socket connections have no keepalives (nor need them).
KEEPALIVE_IDLE_S = 10
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_COUNT = 3
# SQLSTATEs: no room left; waited past lock_timeout; a deadlock or serialization failure.
DISK_FULL = "53100"
OUT_OF_RESOURCES = {"53000", DISK_FULL, "53200", "53300"}
LOCK_NOT_AVAILABLE = "55P03"
BUSY = {LOCK_NOT_AVAILABLE, "40P01", "40001"}
WRONG_PASSWORD = {"28P01", "28000"}
NO_DATABASE = "3D000"
# A connection exception (the class), and a server shut down, crashed or still starting.
CONNECTION_CLASS = "08"
SERVER_GONE = {"57P01", "57P02", "57P03"}


class PostgresqlDialect(Dialect):
    """A database on a PostgreSQL server (psycopg 3), shared by the daemons of several nodes."""

    # postgresql:// names no driver; SQLAlchemy would then pick psycopg2, which gpumux lacks.
    drivernames = ("postgresql+psycopg", "postgresql")
    example_url = "postgresql+psycopg://USER:PASSWORD@HOST/DATABASE"
    shared = True

    def __init__(self, url: URL) -> None:
        super().__init__(url.set(drivername="postgresql+psycopg"))

    @property
    def label(self) -> str:
        """The URL without its password."""
        return self.url.render_as_string(hide_password=True)

    @property
    def _server(self) -> str:
        host = self.url.host or self.url.query.get("host") or "the local socket"
        return f"{host if isinstance(host, str) else host[0]}:{self.url.port or 5432}"

    def lock_path(self, home: Path) -> Path:
        """In the data directory: each node's daemon holds its own; the server is shared."""
        return Layout(home).database_lock

    def check_location(self) -> None:
        """Nothing to check before connecting: the server is reached over the network."""

    def prepare_location(self) -> None:
        """Nothing to create: the database is made by its administrator (createdb)."""

    def engine_options(self) -> dict[str, Any]:
        """A pool that replaces a connection the server dropped, and bounded waits."""
        return {
            "pool_pre_ping": True,
            "pool_size": 10,
            "max_overflow": 20,
            "connect_args": {
                "connect_timeout": CONNECT_TIMEOUT_S,
                "options": " ".join(f"-c {name}={value}" for name, value in session_settings()),
                "application_name": "gpumux",
                "keepalives": 1,
                "keepalives_idle": KEEPALIVE_IDLE_S,
                "keepalives_interval": KEEPALIVE_INTERVAL_S,
                "keepalives_count": KEEPALIVE_COUNT,
            },
        }

    def on_connect(self, dbapi_connection: Any) -> None:
        """Nothing per connection: its settings travel in the startup packet."""

    def on_begin(self, connection: Connection, *, write: bool) -> None:
        """A transaction that will write takes the write lock before its first statement."""
        if write:
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({WRITE_LOCK_KEY})")

    @contextmanager
    def migration_lock(
        self, connection: Connection, *, wait_s: float = MIGRATION_LOCK_WAIT_S
    ) -> Iterator[None]:
        """A session-level advisory lock on this connection: it outlives the transactions of
        the revision check and the upgrade, and ends with the session, should the daemon die.
        A wait past `wait_s` is refused, naming the session that holds the lock."""
        taken = connection.exec_driver_sql(
            f"SELECT pg_try_advisory_lock({MIGRATION_LOCK_KEY})"
        ).scalar_one()
        connection.commit()
        started = time.monotonic()
        while not taken:
            waited = time.monotonic() - started
            pid, holder = _migration_lock_holder(connection)
            if waited >= wait_s:
                raise DatabaseError(
                    f"{self.label}: another node has been migrating the schema for over "
                    f"{wait_s:.0f} s ({holder}); if that node hangs, end its session (SELECT "
                    f"pg_terminate_backend({pid or 'PID'})) and start again"
                )
            log.info(
                "db %s: waiting for another node's migration (%s; %.0f s so far, up to %.0f s)",
                self.label,
                holder,
                waited,
                wait_s,
            )
            taken = _wait_for_migration_lock(
                connection, min(MIGRATION_WAIT_REPORT_S, wait_s - waited)
            )
        try:
            yield
        finally:
            try:
                connection.rollback()
                connection.exec_driver_sql(f"SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})")
                connection.commit()
            except exc.DBAPIError:
                # Back in the pool, the session would hold the lock for the daemon's life;
                # closed, it lets go as the server ends it.
                connection.invalidate()

    def check_integrity(self, connection: Connection) -> list[str]:
        """Nothing to run: the server checks its own pages as it reads them (and their
        checksums where the cluster has them); a damaged one fails the query that meets it."""
        return []

    def damage_failure(self, problems: Sequence[str]) -> str:
        """A damaged cluster is its administrator's to restore."""
        found = "; ".join(problems)
        return (
            f"{self.label} is damaged ({found}); restore it from a backup (pg_dump, or the "
            "cluster's base backup and WAL archive) and start again"
        )

    def open_failure(self, error: exc.DatabaseError) -> str:
        """A wrong password, a missing database and an unreachable server told apart."""
        state = getattr(error.orig, "sqlstate", None)
        reason = _first_line(error.orig)
        user = self.url.username or "the current user"
        if state in WRONG_PASSWORD or "password authentication failed" in reason:
            return (
                f"PostgreSQL at {self._server} refused user {user}: {reason}. Check the user "
                "and password in GPUMUX_DATABASE_URL (or ~/.pgpass) and the server's pg_hba.conf"
            )
        if state == NO_DATABASE or "does not exist" in reason:
            return (
                f"PostgreSQL at {self._server} has no database {self.url.database}: {reason}. "
                f"Create it (createdb -O {user} {self.url.database}) or fix GPUMUX_DATABASE_URL"
            )
        if state in OUT_OF_RESOURCES:
            return (
                f"PostgreSQL at {self._server} is out of resources: {reason}. Free space or "
                "connections on the server and start again (the database is intact)"
            )
        return (
            f"cannot use PostgreSQL at {self._server} ({self.label}): {reason}. Check that the "
            "server runs and that this node reaches it (host, port, firewall), then start again"
        )

    def is_full(self, error: BaseException) -> bool:
        """disk_full and the other out-of-resources states."""
        return _sqlstate(error) in OUT_OF_RESOURCES

    def is_busy(self, error: BaseException) -> bool:
        """A lock waited for past lock_timeout, a deadlock, a serialization failure."""
        return _sqlstate(error) in BUSY

    def is_unreachable(self, error: BaseException) -> bool:
        """A connection that failed or was cut (SQLSTATE class 08, or none from the server at
        all), or a server shutting down, crashed, or starting up (57P01-57P03)."""
        if not isinstance(error, exc.DBAPIError):
            return False
        if error.connection_invalidated:
            return True
        state = _sqlstate(error)
        if state is None:
            # psycopg's OperationalError, as SQLAlchemy wraps it.
            return isinstance(error, exc.OperationalError)
        return state.startswith(CONNECTION_CLASS) or state in SERVER_GONE

    @property
    def busy_timeout_s(self) -> float:
        """lock_timeout, set on every connection."""
        return LOCK_TIMEOUT_MS / 1000

    def seconds_between(
        self, start: SQLColumnExpression[Any], end: SQLColumnExpression[Any]
    ) -> ColumnElement[float]:
        """The interval's epoch, exact to the microsecond."""
        return cast(extract("epoch", end - start), Float)

    def now(self) -> ColumnElement[datetime]:
        """now() as naive UTC; the statement's start rather than the transaction's, which may
        have begun before a wait for the write lock."""
        return func.timezone("UTC", func.statement_timestamp(), type_=DateTime())


def session_settings() -> list[tuple[str, str]]:
    """The server settings every connection starts with (in its startup packet)."""
    return [
        ("lock_timeout", str(LOCK_TIMEOUT_MS)),
        ("idle_in_transaction_session_timeout", str(IDLE_IN_TRANSACTION_TIMEOUT_MS)),
        ("tcp_keepalives_idle", str(KEEPALIVE_IDLE_S)),
        ("tcp_keepalives_interval", str(KEEPALIVE_INTERVAL_S)),
        ("tcp_keepalives_count", str(KEEPALIVE_COUNT)),
        ("timezone", "UTC"),
    ]


def _wait_for_migration_lock(connection: Connection, wait_s: float) -> bool:
    """Wait up to wait_s for the migration lock, then take it; whether it was taken."""
    try:
        connection.exec_driver_sql(f"SET LOCAL lock_timeout = {max(1, round(wait_s * 1000))}")
        connection.exec_driver_sql(f"SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})")
    except exc.OperationalError as error:
        connection.rollback()
        if _sqlstate(error) != LOCK_NOT_AVAILABLE:
            raise
        return False
    connection.commit()
    return True


def _migration_lock_holder(connection: Connection) -> tuple[int | None, str]:
    """The server pid of the session that holds the migration lock, and that session as far
    as this user may see it."""
    # An advisory lock is one database's; pg_locks shows a bigint key as its high (classid)
    # and low (objid) 32 bits.
    found = connection.exec_driver_sql(
        "SELECT a.pid, a.client_addr, a.application_name, a.backend_start "
        "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        f"AND (l.classid::bigint << 32 | l.objid::bigint) = {MIGRATION_LOCK_KEY}"
    ).first()
    connection.commit()
    if found is None:
        return None, "its holder has just let go"
    pid, address, application, started = found
    if started is None:
        return pid, f"held by server pid {pid}"
    return pid, (
        f"held by server pid {pid}: {application or 'a client'} from "
        f"{address or 'the local socket'}, connected at {started:%H:%M:%S %Z}"
    )


def _sqlstate(error: BaseException) -> str | None:
    if isinstance(error, exc.DBAPIError):
        state = getattr(error.orig, "sqlstate", None)
        return state if isinstance(state, str) else None
    return None


def _first_line(error: BaseException | None) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no reason given"
