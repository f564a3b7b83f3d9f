"""The SQLite engine, its sessions, and the schema upgrade that runs when a daemon starts."""

from __future__ import annotations

import logging
import re
import shutil
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, exc, make_url
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 30_000
MOUNTINFO = Path("/proc/self/mountinfo")
# Filesystems shared between hosts (kernel fstype names, FUSE ones as "fuse.<name>"): SQLite's
# WAL index lives in shared memory (the -shm file mapped by every connection), which these
# cannot keep coherent across hosts, and their byte-range locks are unreliable.
NETWORK_FILESYSTEMS = frozenset(
    {
        "9p",
        "afs",
        "beegfs",
        "ceph",
        "cifs",
        "coda",
        "fuse.ceph",
        "fuse.ceph-fuse",
        "fuse.gcsfuse",
        "fuse.glusterfs",
        "fuse.juicefs",
        "fuse.rclone",
        "fuse.s3fs",
        "fuse.sshfs",
        "gfs2",
        "glusterfs",
        "gpfs",
        "lustre",
        "ncpfs",
        "nfs",
        "nfs4",
        "ocfs2",
        "orangefs",
        "panfs",
        "pvfs2",
        "smb3",
        "smbfs",
        "sshfs",
        "wekafs",
    }
)
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


class DatabaseError(RuntimeError):
    """The database cannot be used as it is; the message says why and what to do."""


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo: where a filesystem is mounted, its type and source."""

    mount_point: PurePosixPath
    fstype: str
    source: str


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts listed in the text of a /proc/PID/mountinfo file, in its order."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        # ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS
        if "-" not in fields[6:]:
            continue
        separator = fields.index("-", 6)
        if len(fields) < separator + 3:
            continue
        mounts.append(
            Mount(
                mount_point=PurePosixPath(_unescape(fields[4])),
                fstype=fields[separator + 1],
                source=_unescape(fields[separator + 2]),
            )
        )
    return mounts


def _unescape(field: str) -> str:
    # The kernel writes space, tab, newline and backslash as \040, \011, \012 and \134.
    return _OCTAL_ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), field)


def mount_holding(path: PurePosixPath, mounts: Sequence[Mount]) -> Mount | None:
    """The mount that holds an absolute, resolved path: the longest mount point above it.

    Of mounts on one mount point, the last listed is the one on top.
    """
    holder = None
    for mount in mounts:
        if path.is_relative_to(mount.mount_point) and (
            holder is None or len(mount.mount_point.parts) >= len(holder.mount_point.parts)
        ):
            holder = mount
    return holder


def require_local_filesystem(path: Path, *, mountinfo: str | None = None) -> None:
    """Refuse a database on a network filesystem, where WAL mode cannot work.

    `mountinfo` is the text of /proc/self/mountinfo, read when not given; where there is none
    (not Linux) nothing is checked.
    """
    # A database not created yet resolves through its nearest existing directory.
    resolved = path.resolve()
    if mountinfo is None:
        try:
            mountinfo = MOUNTINFO.read_text(errors="surrogateescape")
        except OSError as error:
            log.debug("db %s: filesystem not checked: %s", path, error)
            return
    mount = mount_holding(PurePosixPath(resolved), parse_mountinfo(mountinfo))
    if mount is None or mount.fstype not in NETWORK_FILESYSTEMS:
        return
    raise DatabaseError(
        f"{path} is on a network filesystem ({mount.fstype} {mount.source} mounted at "
        f"{mount.mount_point}); SQLite's WAL mode keeps its index in memory shared by the "
        "processes of one host, so a database there can be corrupted or fail to open. "
        "Put it on a local disk: set GPUMUX_DB (--db) to a file there, or GPUMUX_HOME "
        "(--home) to a local directory such as /var/lib/gpumux"
    )


def make_engine(url: str) -> Engine:
    """An engine whose SQLite connections use WAL, foreign keys and a busy timeout.

    A database file on a network filesystem is refused (DatabaseError) before any connection.
    """
    database = make_url(url).database
    # Every user of the database gets its engine here, where WAL is switched on: refusing here
    # stops the daemon, the CLI and the tools alike before a -wal or -shm file is created.
    if database and database != ":memory:" and not database.startswith("file:"):
        require_local_filesystem(Path(database))
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
    """Bring the schema to the newest revision; refuse a database from a newer gpumux."""
    config = alembic_config(engine)
    scripts = ScriptDirectory.from_config(config)
    try:
        with engine.connect() as connection:
            current = MigrationContext.configure(connection).get_current_revision()
    except exc.DatabaseError as error:
        raise DatabaseError(_open_failure(engine, error)) from error
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


# SQLITE_FULL, and SQLITE_IOERR_SHMSIZE: no room to create the WAL index (the -shm file).
_NO_ROOM_CODES = {13, 4874}


def _open_failure(engine: Engine, error: exc.DatabaseError) -> str:
    """Why the database could not be opened, and what to do: a full disk is not a bad file."""
    path = engine.url.database or ""
    code = getattr(error.orig, "sqlite_errorcode", None)
    folder = Path(path).parent
    try:
        no_room = shutil.disk_usage(folder).free == 0
    except OSError:
        no_room = False
    if code in _NO_ROOM_CODES or no_room:
        return (
            f"{path} cannot be opened: the disk is full ({error.orig}); free space in "
            f"{folder} and start again (the database itself is intact)"
        )
    return (
        f"{path} cannot be opened as a database ({error.orig}); move it aside or pass another --db"
    )
