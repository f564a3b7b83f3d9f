"""A throwaway PostgreSQL cluster for the tests: Debian's server binaries, initdb in a temporary
directory, postgres listening on a Unix socket only, stopped and removed after the run.

As root the server runs as the `postgres` system user (initdb refuses root), through runuser.
Where no server can be had, `unavailable()` says why and the tests that need one skip.
"""

from __future__ import annotations

import itertools
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from builders import unmarked_environment
from psycopg import sql
from sqlalchemy import Engine, event

SERVER_ROOTS = (Path("/usr/lib/postgresql"),)
SUPERUSER = "postgres"
# Durability off: a throwaway cluster never outlives the run; many connections: several daemons.
SERVER_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "300",
    "shared_buffers": "32MB",
    "listen_addresses": "''",
}
# The superuser connects without a password; every other role needs its own (a wrong one fails).
PG_HBA = f"local all {SUPERUSER} trust\nlocal all all scram-sha-256\n"


# The databases `settings` can point at.
BACKENDS = ("sqlite", "postgresql")
# The directories whose tests of the store, the API and the scheduler run on each backend.
ON_BOTH_BACKENDS = ("storage", "server/api", "scheduling")
# A test of SQLite itself (query plans, pragmas, its file and lock): run on SQLite alone.
SQLITE_ONLY = "sqlite_only"
# A test whose requests are answered before any query but their token's (refused by validation,
# their size, their method; a document served): nothing of it reaches a backend to compare, so
# it runs on SQLite alone, held to it by statements_beyond_authentication.
NO_QUERY = "no_query"
# The tables authenticating a request reads and writes; statements that name no table (BEGIN,
# COMMIT, a pragma) are the connection's.
AUTHENTICATION_TABLES = frozenset({"api_tokens", "owners"})
_TABLES = re.compile(r"\b(?:FROM|JOIN|UPDATE|INTO)\s+\"?(\w+)", re.IGNORECASE)
_CONNECTION = re.compile(r"\s*(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE|PRAGMA)\b", re.IGNORECASE)


def on_both_backends(metafunc: pytest.Metafunc, tests: Path) -> None:
    """Run a test of ON_BOTH_BACKENDS (under `tests`) that uses `settings` (or `sessions`,
    `api`) once per backend, unless it is marked sqlite_only or no_query."""
    where = metafunc.definition.path
    if (
        "backend" in metafunc.fixturenames
        and any(where.is_relative_to(tests / folder) for folder in ON_BOTH_BACKENDS)
        and metafunc.definition.get_closest_marker(SQLITE_ONLY) is None
        and metafunc.definition.get_closest_marker(NO_QUERY) is None
    ):
        metafunc.parametrize("backend", BACKENDS)


@contextmanager
def statements_beyond_authentication(engine: Engine) -> Iterator[list[str]]:
    """The statements run on `engine` during the block (listed as they come) other than those of
    the connection and of authenticating a request (AUTHENTICATION_TABLES)."""
    found: list[str] = []

    def record(*args: Any) -> None:
        statement: str = args[2]
        tables = set(_TABLES.findall(statement))
        if not (_CONNECTION.match(statement) or tables and tables <= AUTHENTICATION_TABLES):
            found.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield found
    finally:
        event.remove(engine, "before_cursor_execute", record)


def server_bin() -> Path | None:
    """The newest installed server's bin directory, None if there is none."""
    found = [
        root / version / "bin"
        for root in SERVER_ROOTS
        if root.is_dir()
        for version in os.listdir(root)
        if (root / version / "bin" / "initdb").is_file()
    ]
    return max(found, key=lambda path: int(path.parent.name), default=None)


def unavailable() -> str | None:
    """Why no throwaway cluster can be started here, or None when one can."""
    if server_bin() is None:
        return "no PostgreSQL server installed (Debian: apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SUPERUSER)
        except KeyError:
            return "running as root and no 'postgres' system user to run the server as"
    return None


@dataclass
class Cluster:
    """A running server: its data and socket directory, and fresh databases on demand."""

    root: Path
    bin: Path
    _names: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "socket"

    def url(self, database: str, *, user: str = SUPERUSER, password: str | None = None) -> str:
        """The SQLAlchemy URL of a database of this cluster, over its socket."""
        auth = user if password is None else f"{user}:{password}"
        return f"postgresql+psycopg://{auth}@/{database}?host={self.socket_dir}"

    def connect(self, database: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        """A superuser's autocommit connection (for CREATE DATABASE and the like)."""
        return psycopg.connect(
            host=str(self.socket_dir), dbname=database, user=SUPERUSER, autocommit=True
        )

    def create_database(self, *, template: str = "template1") -> str:
        """A new database's name: empty, or a copy of `template` (which nothing may be using)."""
        name = f"gpumux_test_{os.getpid()}_{next(self._names)}"
        with self.connect() as connection:
            connection.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )
        return name

    def drop_database(self, name: str) -> None:
        """Drop a database, ending whatever connections to it are left."""
        with self.connect() as connection:
            connection.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def _run(self, *argv: str | Path) -> None:
        command = [str(part) for part in argv]
        if os.geteuid() == 0:
            command = ["runuser", "-u", SUPERUSER, "--", *command]
        # The server is the cluster's, not the test's that starts or resumes it.
        subprocess.run(
            command, check=True, capture_output=True, text=True, env=unmarked_environment()
        )

    def start(self) -> None:
        """initdb, then postgres on the Unix socket; returns once it accepts connections."""
        self.socket_dir.mkdir(parents=True)
        if os.geteuid() == 0:
            postgres = pwd.getpwnam(SUPERUSER)
            for path in (self.root, self.socket_dir):
                os.chown(path, postgres.pw_uid, postgres.pw_gid)
        self._run(
            self.bin / "initdb",
            "-D",
            self.data,
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )
        (self.data / "pg_hba.conf").write_text(PG_HBA)
        self._run(*self._pg_ctl_start())

    def _pg_ctl_start(self) -> tuple[str | Path, ...]:
        options = " ".join(f"-c {name}={value}" for name, value in SERVER_SETTINGS.items())
        log, socket_option = self.root / "server.log", f"{options} -k {self.socket_dir}"
        return (self.bin / "pg_ctl", "-D", self.data, "-l", log, "-o", socket_option, "-w", "start")

    def halt(self) -> None:
        """Stop the server, ending every connection, and keep its files (resume() restarts it).

        A fast stop, not an immediate one: with synchronous_commit off (SERVER_SETTINGS) a crash
        would lose the last commits, which a real server, durable, keeps.
        """
        self._run(self.bin / "pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")

    def resume(self) -> None:
        """Start the halted server again on its data; returns once it accepts connections."""
        self._run(*self._pg_ctl_start())

    def stop(self) -> None:
        """Stop the server at once and remove its files."""
        self._run(self.bin / "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


def start_cluster(root: Path) -> Cluster:
    """A started cluster in `root`, an empty directory (owner-only) that it removes at stop."""
    bin_dir = server_bin()
    assert bin_dir is not None, unavailable()
    root.chmod(0o700)
    cluster = Cluster(root=root, bin=bin_dir)
    try:
        cluster.start()
    except subprocess.CalledProcessError as error:
        log = root / "server.log"
        shown = log.read_text() if log.exists() else ""
        raise RuntimeError(f"{error.cmd}: {error.stderr}\n{shown}") from error
    return cluster


def throwaway_cluster(prefix: str) -> Iterator[Cluster]:
    """A started cluster in a new temporary directory, stopped and removed after; skips,
    saying why, where none can be started. The body of a generator fixture (`yield from`)."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    # Not under pytest's tmp_path: as root the server runs as `postgres`, which must reach it.
    cluster = start_cluster(Path(tempfile.mkdtemp(prefix=prefix)))
    yield cluster
    cluster.stop()
