"""Finding the daemon: the one at --url, the one named in the lock file, or an embedded one."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpumux.cli.state import CliError, CliState, EmbeddedDaemon
from gpumux.client import Client, DaemonUnreachable
from gpumux.config import SHARED_SOCKET, Settings
from gpumux.home.lockfile import DaemonAlreadyRunning, DaemonError, lock_beside, read_lock_url

# A daemon that just took the lock writes its URL right after binding its socket.
LOCK_URL_WAIT_S = 5.0
IDLE_POLL_S = 0.5


@dataclass
class Connection:
    """A client for the daemon in use, and the embedded daemon when this run started one."""

    client: Client
    embedded: EmbeddedDaemon | None = None


def _answering(url: str) -> Client | None:
    client = Client(url)
    try:
        client.health()
    except DaemonUnreachable:
        client.close()
        return None
    return client


def _lock_path(settings: Settings) -> Path | None:
    """The lock file of the settings' database, where a daemon holding it writes its URL."""
    # Beside an SQLite file; the command line knows no other dialect's (it imports no storage).
    database_file = settings.database_file
    return None if database_file is None else lock_beside(database_file)


def find_daemon(url: str, settings: Settings) -> Client:
    """A client for the daemon at `url`, or for the one holding the default database's lock."""
    client = _answering(url)
    if client is not None:
        return client
    lock_path = _lock_path(settings)
    lock_url = None if lock_path is None else read_lock_url(lock_path)
    if lock_url is not None and lock_url != url:
        client = _answering(lock_url)
        if client is not None:
            return client
    if url == f"unix:{settings.layout.socket}" and SHARED_SOCKET.exists():
        # A shared server's daemon (deploy/gpumux.service), when this user names none.
        client = _answering(f"unix:{SHARED_SOCKET}")
        if client is not None:
            return client
    raise DaemonUnreachable(url, "start one with `gpumux serve`, or give its address with --url")


def connect(state: CliState, url: str | None) -> Client:
    """The client a read or control command uses (it never starts a daemon)."""
    return find_daemon(state.resolve_url(url), state.settings)


def _wait_for_lock_url(lock_path: Path) -> str | None:
    deadline = time.monotonic() + LOCK_URL_WAIT_S
    while (url := read_lock_url(lock_path)) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return url


@contextlib.contextmanager
def daemon_for_sweep(state: CliState, url: str) -> Iterator[Connection]:
    """The daemon to submit to; when none answers, an embedded one for the `with` block."""
    settings = state.settings
    try:
        client = find_daemon(url, settings)
    except DaemonUnreachable:
        pass
    else:
        with client:
            yield Connection(client)
        return
    database = settings.database_file or "the database of GPUMUX_DATABASE_URL"
    state.note(
        f"no daemon at {url}; running an embedded one on {database} until the queue is empty"
    )
    try:
        with contextlib.ExitStack() as stack:
            running: EmbeddedDaemon | None = None
            try:
                running = stack.enter_context(
                    state.runner.embedded(settings.model_copy(update={"url": url}))
                )
            except DaemonAlreadyRunning as error:
                client = stack.enter_context(_starting_daemon(state, error))
            else:
                client = stack.enter_context(Client(running.url))
            yield Connection(client, running)
    except DaemonError as error:
        # Raised when the embedded daemon cannot start (port, socket) or failed while running.
        raise CliError(str(error)) from error


def _starting_daemon(state: CliState, error: DaemonAlreadyRunning) -> Client:
    """The daemon that took the database's lock a moment before this one could."""
    lock_path = _lock_path(state.settings)
    other = error.url or (None if lock_path is None else _wait_for_lock_url(lock_path))
    client = _answering(other) if other else None
    if client is None:
        raise CliError(str(error)) from error
    state.note(f"using the daemon that just started at {other}")
    return client


def wait_until_idle(state: CliState, client: Client) -> None:
    """Keep an embedded daemon until no trial is queued or running (other sweeps may use it)."""
    told = False
    while (health := client.health()).queued_trials or health.active_trials:
        if not told:
            pending = health.queued_trials + health.active_trials
            state.note(
                f"{pending} trials of other sweeps are queued or running; the embedded daemon "
                "runs them before it stops (Ctrl-C requeues them for the next gpumux sweep)"
            )
            told = True
        time.sleep(IDLE_POLL_S)
