"""SQLite, gpumux's embedded database: one local file in WAL mode, shared by one host."""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import URL, ColumnElement, DateTime, SQLColumnExpression, exc, func
from sqlalchemy.engine import Connection

from gpumux.home.lockfile import lock_beside
from gpumux.storage.dialects.base import DatabaseError, Dialect
from gpumux.storage.dialects.mounts import require_local_filesystem

BUSY_TIMEOUT_MS = 30_000
SECONDS_PER_DAY = 86_400.0
# Primary result codes (the low byte of an extended one), from sqlite3.h.
SQLITE_BUSY = 5
SQLITE_LOCKED = 6
SQLITE_CORRUPT = 11
SQLITE_FULL = 13
# SQLITE_IOERR_SHMSIZE: no room to create the WAL index (the -shm file) when opening.
SQLITE_IOERR_SHMSIZE = 4874
# How many of quick_check's findings a refusal quotes: enough to say what, short enough to read.
DAMAGE_LINES = 3
# The names SQLite and gpumux make beside the file: the longest must fit the filesystem too.
SQLITE_BESIDE = ("-journal", "-wal", "-shm")
LOCK_BESIDE = ".lock"
BESIDE = (*SQLITE_BESIDE, LOCK_BESIDE)


class SqliteDialect(Dialect):
    """A database file on a local disk: WAL, foreign keys, a busy timeout, BEGIN IMMEDIATE."""

    drivernames = ("sqlite", "sqlite+pysqlite")
    example_url = "sqlite:///PATH/TO/gpumux.db"
    shared = False

    def __init__(self, url: URL) -> None:
        super().__init__(url)
        database = url.database or ""
        if database in {"", ":memory:"} or database.startswith("file:"):
            # Every connection to an in-memory database gets one of its own; the daemon, its
            # tools and the CLI must share a file.
            raise DatabaseError(
                f"{url.render_as_string(hide_password=True)}: gpumux keeps its state in an "
                f"SQLite file; name one as {self.example_url} (or set GPUMUX_DB to the file)"
            )
        self.file = Path(database)

    @property
    def label(self) -> str:
        """The file's path."""
        return str(self.file)

    def lock_path(self, home: Path) -> Path:
        """Beside the file: two data directories cannot hold one database at once."""
        return lock_beside(self.file)

    def check_location(self) -> None:
        """Refuse a file on a network filesystem, where WAL mode cannot work."""
        require_local_filesystem(self.file)

    def prepare_location(self) -> None:
        """The file and its directory, owner-only: the database holds submitters' environments.
        A name whose journal or lock file the filesystem cannot hold is refused before the file
        is made (SQLite would fail later, as if the file were damaged)."""
        self._check_room_beside()
        self.file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(self.file, os.O_CREAT | os.O_WRONLY, 0o600))

    def _check_room_beside(self) -> None:
        """Refuse (ENAMETOOLONG) a name whose files beside it the filesystem cannot name: SQLite's
        beside the file it opens (a symlink's target), the lock beside the name given."""
        existing = next(parent for parent in self.file.absolute().parents if parent.exists())
        limit = os.pathconf(existing, "PC_NAME_MAX")
        if limit <= 0:
            return
        target = self.file.resolve()
        names = [(target.name, SQLITE_BESIDE), (self.file.name, (LOCK_BESIDE,))]
        if any(len(os.fsencode(name)) + max(map(len, beside)) > limit for name, beside in names):
            raise OSError(
                errno.ENAMETOOLONG,
                f"the file's name leaves no room for its {'/'.join(BESIDE)} files beside it",
            )

    def engine_options(self) -> dict[str, Any]:
        """The driver's own transaction handling off (on_begin emits BEGIN), any thread."""
        return {"connect_args": {"isolation_level": None, "check_same_thread": False}}

    def on_connect(self, dbapi_connection: sqlite3.Connection) -> None:
        """WAL, foreign keys, the busy timeout and full syncs, on every connection."""
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        # FULL: a commit survives a power cut too; the write rate here is a few per trial.
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.close()

    def on_begin(self, connection: Connection, *, write: bool) -> None:
        """BEGIN IMMEDIATE for a transaction that will write, BEGIN otherwise."""
        # A deferred transaction that reads and then writes fails at once with SQLITE_BUSY when
        # another writer got in between; BEGIN IMMEDIATE takes the write lock first and waits.
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    @contextmanager
    def migrating(self, connection: Connection) -> Iterator[None]:
        """Foreign keys off while migrations run, checked before they commit."""
        # SQLite alters a table by copying it and dropping the old one; with foreign keys on,
        # that drop would cascade to every row that refers to it. The pragma is ignored inside
        # a transaction, so it is set on the driver's connection before one begins.
        driver = connection.connection.driver_connection
        assert isinstance(driver, sqlite3.Connection)
        driver.execute("PRAGMA foreign_keys=OFF")
        try:
            with connection.begin():
                yield
                broken = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
                if broken:
                    raise DatabaseError(
                        f"{self.label}: a migration left rows whose references point nowhere "
                        f"({broken[:5]}); nothing was changed. Report this to gpumux"
                    )
        finally:
            driver.execute("PRAGMA foreign_keys=ON")

    def check_integrity(self, connection: Connection) -> list[str]:
        """PRAGMA quick_check: every page and record readable (indexes not compared to tables)."""
        try:
            found = connection.exec_driver_sql(f"PRAGMA quick_check({DAMAGE_LINES})").scalars()
            rows = [str(row) for row in found]
        except exc.DatabaseError as error:
            # A page too damaged to walk stops the check itself with SQLITE_CORRUPT.
            if _primary_code(error) == SQLITE_CORRUPT:
                return [str(error.orig)]
            raise
        if rows == ["ok"]:
            return []
        lines = (line for row in rows for line in row.splitlines())
        return [line for line in lines if not line.startswith("***")][:DAMAGE_LINES]

    def damage_failure(self, problems: Sequence[str]) -> str:
        """The file's path, what quick_check found, and the two ways back: a backup or .recover."""
        found = "; ".join(problems[:DAMAGE_LINES])
        recovered = self.file.with_suffix(".recovered" + self.file.suffix)
        return (
            f"{self.file} is damaged (quick_check: {found}); gpumux will not start on it. "
            "Restore it from a backup, or copy what can still be read into a new file with "
            f"`sqlite3 {shlex.quote(str(self.file))} .recover | "
            f"sqlite3 {shlex.quote(str(recovered))}` (.dump in place of .recover where that "
            f"fails) and start with GPUMUX_DB={recovered}"
        )

    def open_failure(self, error: exc.DatabaseError) -> str:
        """A full disk (the file is intact) told apart from a damaged file and from one that
        is not a database."""
        code = getattr(error.orig, "sqlite_errorcode", None)
        folder = self.file.parent
        try:
            no_room = shutil.disk_usage(folder).free == 0
        except OSError:
            no_room = False
        if code in {SQLITE_FULL, SQLITE_IOERR_SHMSIZE} or no_room:
            return (
                f"{self.file} cannot be opened: the disk is full ({error.orig}); free space in "
                f"{folder} and start again (the database itself is intact)"
            )
        if _primary_code(error) == SQLITE_CORRUPT:
            return self.damage_failure([str(error.orig)])
        return (
            f"{self.file} cannot be opened as a database ({error.orig}); check that --db or "
            "GPUMUX_DB names gpumux's database, then restore it from a backup or move it aside "
            "to start with an empty one"
        )

    def is_full(self, error: BaseException) -> bool:
        """SQLITE_FULL: the disk, or max_page_count, left no room."""
        return isinstance(error, exc.OperationalError) and (
            _primary_code(error) == SQLITE_FULL or "database or disk is full" in str(error)
        )

    def is_busy(self, error: BaseException) -> bool:
        """SQLITE_BUSY or SQLITE_LOCKED after the busy timeout."""
        return isinstance(error, exc.OperationalError) and (
            _primary_code(error) in {SQLITE_BUSY, SQLITE_LOCKED}
            or "database is locked" in str(error)
        )

    def is_unreachable(self, error: BaseException) -> bool:
        """Never: the file is local, and a file that cannot be opened is no passing state."""
        return False

    @property
    def busy_timeout_s(self) -> float:
        """The busy_timeout pragma every connection sets."""
        return BUSY_TIMEOUT_MS / 1000

    def seconds_between(
        self, start: SQLColumnExpression[Any], end: SQLColumnExpression[Any]
    ) -> ColumnElement[float]:
        """julianday() of the naive UTC text each timestamp is stored as, rounded to the
        millisecond: SQLite's date functions keep milliseconds, and the day fraction's rounding
        would otherwise put a wait of exactly 1 s just above or below a bucket's bound."""
        return func.round((func.julianday(end) - func.julianday(start)) * SECONDS_PER_DAY, 3)

    def now(self) -> ColumnElement[datetime]:
        """UTC text to the millisecond, as the stored timestamps are written (and compared)."""
        return func.strftime("%Y-%m-%d %H:%M:%f", "now", type_=DateTime())


def _primary_code(error: exc.DBAPIError) -> int | None:
    if isinstance(error.orig, sqlite3.Error):
        return error.orig.sqlite_errorcode & 0xFF
    return None
