"""Real `gpumux serve` processes for the reliability tests: start, stop, kill -9, restart."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

import httpx
import pytest
from builders import daemon_bearer
from ports import free_port

from gpumux.processes.spawner_client import SPAWNER_PATH

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0


def fd_targets(pid: int) -> dict[int, str]:
    """What each open file descriptor of a process refers to (readlink of /proc/PID/fd/N)."""
    targets = {}
    with contextlib.suppress(FileNotFoundError, PermissionError):
        for name in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(FileNotFoundError, PermissionError):
                targets[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
    return targets


def _stat_fields(pid: int) -> list[str]:
    # Fields from the state on (field 3): the command name before it may hold spaces and ')'.
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def _spawner(pid: int) -> bool:
    """Whether the process is a gpumux spawner (the helper that forks supervisors)."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return SPAWNER_PATH.encode() in words


def _environ(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def start_ticks(pid: int) -> int | None:
    """When a process started, in clock ticks since boot (with the pid, an identity)."""
    try:
        return int(_stat_fields(pid)[19])
    except (OSError, ValueError, IndexError):
        return None


class DaemonProcess:
    """A `gpumux serve` subprocess on 127.0.0.1 over one data directory.

    It keeps its port across restarts, so that trials started by one run reach the next.
    `env` is added to the environment it starts with (GPUMUX_HOME=home, GPUMUX_SPLIT_SEARCH=0, the
    test's own environment less its GPUMUX_ variables); `args` to the command line; with `uds`
    it also listens on that Unix socket. Its stdout and stderr are appended to `log_path`.
    """

    def __init__(
        self,
        home: Path,
        *,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        port: int | None = None,
        uds: Path | None = None,
    ) -> None:
        self.home = home
        self.uds = uds
        self.port = port if port is not None else free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = home.with_name(home.name + ".log")
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("GPUMUX_")},
            "GPUMUX_HOME": str(home),
            "GPUMUX_SPLIT_SEARCH": "0",
            **(env or {}),
        }
        self.args = list(args)
        self.popen: subprocess.Popen[bytes] | None = None
        self._drain: threading.Thread | None = None

    @property
    def pid(self) -> int:
        """The running daemon's process id."""
        assert self.popen is not None, "start() first"
        return self.popen.pid

    python = sys.executable

    def spawn_options(self) -> dict[str, Any]:
        """What else `subprocess.Popen` is given to start the daemon (a subclass: its user)."""
        return {}

    @property
    def running(self) -> bool:
        """Whether the daemon process has been started and has not exited."""
        return self.popen is not None and self.popen.poll() is None

    def start(self, timeout: float = START_TIMEOUT_S) -> dict[str, object]:
        """Start the daemon (again, on the same home and port); its /health once it answers."""
        self.launch()
        return self.serving(timeout)

    def launch(self) -> None:
        """Start the daemon's process and return at once (serving() waits until it serves)."""
        assert not self.running, "already running"
        command = [self.python, "-m", "gpumux", "serve", "--host", "127.0.0.1"]
        command += ["--port", str(self.port), *self.args]
        if self.uds is not None:
            command += ["--uds", str(self.uds)]
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                command,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                **self.spawn_options(),
            )

    def serving(self, timeout: float = START_TIMEOUT_S) -> dict[str, object]:
        """Wait until the launched daemon serves; its /health then."""
        assert self.popen is not None and self.popen.stdout is not None, "launch() first"
        serving = self.url if self.uds is None else f"unix:{self.uds} and {self.url}"
        # `serve` prints this line once it listens: connections made from then on are served.
        line = self._read_line(self.popen.stdout, time.monotonic() + timeout)
        if not line.startswith(f"gpumux: serving on {serving} "):
            self.wait()
            raise AssertionError(f"daemon did not start: {line!r}\n{self.log_tail()}")
        # Anything it prints later must not fill the pipe and block it.
        self._drain = threading.Thread(
            target=self._copy_to_log, args=(self.popen.stdout,), daemon=True
        )
        self._drain.start()
        return self.health()

    def health(self) -> dict[str, object]:
        """The daemon's answer to GET /health (asserted 200)."""
        with self.client() as client:
            response = client.get("/health")
        assert response.status_code == 200, response.text
        health: dict[str, object] = response.json()
        return health

    def _read_line(self, stdout: IO[bytes], deadline: float) -> str:
        data = b""
        while not data.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([stdout], [], [], remaining)[0]:
                raise AssertionError(f"daemon silent at start\n{self.log_tail()}")
            chunk = os.read(stdout.fileno(), 1)
            if not chunk:
                break
            data += chunk
        return data.decode(errors="replace")

    def _copy_to_log(self, stdout: IO[bytes]) -> None:
        with stdout, open(self.log_path, "ab") as log:
            for line in stdout:
                log.write(line)
                log.flush()

    def client(self, *, timeout: float = 30.0) -> httpx.Client:
        """An HTTP client of this daemon, with the token it keeps for its own user."""
        return httpx.Client(base_url=self.url, timeout=timeout, headers=daemon_bearer(self.home))

    def send(self, signum: int) -> None:
        """Send a signal to the daemon (twice SIGTERM: an immediate stop)."""
        assert self.popen is not None, "start() first"
        self.popen.send_signal(signum)

    def wait(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """Wait for the daemon to exit; its return code."""
        assert self.popen is not None, "start() first"
        returncode = self.popen.wait(timeout=timeout)
        if self._drain is not None:
            self._drain.join(timeout)
            self._drain = None
        elif self.popen.stdout is not None:
            self.popen.stdout.close()
        return returncode

    def stop(self, signum: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int:
        """Stop the daemon with a signal (SIGTERM: a graceful stop) and return its exit code."""
        self.send(signum)
        return self.wait(timeout)

    def kill9(self) -> None:
        """Kill the daemon with SIGKILL, as a crash or the OOM killer would, and reap it."""
        self.stop(signal.SIGKILL)

    def spawned(self) -> set[int]:
        """Processes started for this daemon and still running.

        Supervisors and trials run in sessions of their own and may outlive the daemon. Counted:
        the daemon's descendants; processes naming its home on their command line (a
        supervisor names its run directory) and their descendants; and while the daemon runs,
        so that its port is its own, processes carrying its GPUMUX_URL (a trial whose
        supervisor is gone).
        """
        url_mark = f"GPUMUX_URL={self.url}".encode()
        home_mark = str(self.home).encode()
        parents: dict[int, int] = {}
        daemon = self.pid if self.running else None
        roots = {daemon} if daemon is not None else set()
        own = set()
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            with contextlib.suppress(OSError, ValueError, IndexError):
                parents[pid] = int(_stat_fields(pid)[1])
                words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if any(word == home_mark or word.startswith(home_mark + b"/") for word in words):
                    roots.add(pid)
                elif self.running and url_mark in _environ(pid):
                    own.add(pid)
        for pid in parents:
            ancestor = parents.get(pid)
            while ancestor is not None and ancestor > 1:
                if ancestor in roots:
                    own.add(pid)
                    break
                ancestor = parents.get(ancestor)
        # The running daemon's spawner is its helper, not a process started for a trial.
        helpers = {pid for pid, parent in parents.items() if parent == daemon and _spawner(pid)}
        return (own | roots) - helpers - {daemon, os.getpid(), os.getppid()}

    def kill_spawned(self, pids: Mapping[int, int | None] | None = None) -> None:
        """SIGKILL these processes ({pid: start ticks}; default: spawned()) if still the same."""
        if pids is None:
            pids = {pid: start_ticks(pid) for pid in self.spawned()}
        for pid, started in pids.items():
            # A pid whose start time changed names another process since.
            if started is not None and start_ticks(pid) == started:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        """Stop the daemon if it runs (SIGTERM, then SIGKILL), and kill what it left running."""
        left = {pid: start_ticks(pid) for pid in self.spawned()}
        if self.running:
            try:
                self.stop(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill9()
        elif self.popen is not None:
            self.wait()
        self.kill_spawned(left)
        self.kill_spawned()

    def log_tail(self, lines: int = 40) -> str:
        """The end of the daemon's output, for failure messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class DaemonFactory(Protocol):
    """The make_daemon fixture: a DaemonProcess, started unless start=False."""

    def __call__(
        self,
        *,
        home: Path | None = None,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        start: bool = True,
    ) -> DaemonProcess: ...


@pytest.fixture
def make_daemon(tmp_path: Path) -> Iterator[DaemonFactory]:
    """Make DaemonProcess objects; all are closed at the end of the test.

    Homes default to tmp_path/"home", then tmp_path/"home2" and so on.
    """
    made: list[DaemonProcess] = []

    def make(
        *,
        home: Path | None = None,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        start: bool = True,
    ) -> DaemonProcess:
        if home is None:
            home = tmp_path / ("home" if not made else f"home{len(made) + 1}")
        daemon = DaemonProcess(home, env=env, args=args)
        made.append(daemon)
        if start:
            daemon.start()
        return daemon

    yield make
    for daemon in made:
        daemon.close()


@pytest.fixture
def daemon(make_daemon: DaemonFactory) -> DaemonProcess:
    """A started `gpumux serve` on tmp_path/"home", closed at the end of the test."""
    return make_daemon()
