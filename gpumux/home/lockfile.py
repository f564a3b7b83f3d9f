"""The daemon's lock files: one daemon holds a database, and a data directory, at a time.

The database's lock file also says where its daemon answers ("PID URL"), so that the CLI finds
a daemon started on another address. Light: the CLI reads it without importing the server.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from gpumux.home.layout import Layout


class DaemonError(RuntimeError):
    """The daemon cannot start; the message says why and what to do."""


class DaemonAlreadyRunning(DaemonError):
    """Another daemon holds the database; `url` is where it answers."""

    def __init__(self, message: str, url: str | None) -> None:
        super().__init__(message)
        self.url = url


def lock_beside(database_file: Path) -> Path:
    """The lock file of a database kept in a file: beside it, so that it holds across homes."""
    return database_file.with_name(database_file.name + ".lock")


def acquire_home_lock(home: Path) -> IO[str]:
    """Hold the data directory for the daemon's life: its run records, logs, token and socket
    are one daemon's; refuse if another daemon holds it (even over another database)."""
    path = Layout(home).daemon_lock
    lock_file = open(os.open(path, os.O_RDWR | os.O_CREAT, 0o600), "r+")  # noqa: SIM115
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock_file.close()
        raise DaemonAlreadyRunning(
            f"another gpumux daemon is using the data directory {home}; stop it "
            "first, or give this one its own --home",
            None,
        ) from None
    return lock_file


def acquire_lock(lock_path: Path, *, database: str) -> IO[str]:
    """Hold the database's lock file for the daemon's life; refuse if another daemon holds it."""
    descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    lock_file = open(descriptor, "a+")  # noqa: SIM115 - held open until the daemon exits
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock_file.seek(0)
        holder = lock_file.read().split()
        lock_file.close()
        pid, url = (holder + ["?", ""])[:2] if holder else ("?", "")
        raise DaemonAlreadyRunning(
            f"another gpumux daemon (pid {pid}, {url or 'address unknown'}) is using "
            f"{database}; stop it first, or give this one its own --home",
            url or None,
        ) from None
    except OSError:
        lock_file.close()
        raise
    return lock_file


def record_holder(lock_file: IO[str], url: str) -> None:
    """Write this daemon's pid and URL into the lock file it holds."""
    lock_file.seek(0)
    lock_file.truncate()
    lock_file.write(f"{os.getpid()} {url}\n")
    lock_file.flush()


def read_lock_url(lock_path: Path) -> str | None:
    """The URL written in a daemon's lock file, if a daemon holds it."""
    try:
        holder = lock_path.read_text().split()
    except OSError:
        return None
    return holder[1] if len(holder) >= 2 else None
