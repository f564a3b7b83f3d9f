"""`python -m gpumux` run hundreds of times, each a process of its own, without importing gpumux
each time (0.8 s of CPU a start, most of a hostile argument's case).

A server, this file run by the interpreter, imports gpumux (PRELOADED), then forks a child per
command line: the child takes the case's directory, environment, argv, stdin from /dev/null and
stdout and stderr into files, runs its module (`gpumux`) as `python -m` does and exits as the
interpreter exits (see _exit). Its argv is decoded as the interpreter decodes its own
(os.fsdecode: the file system's encoding, undecodable bytes as surrogates;
argv_as_the_interpreter_decodes_it checks it).

Each case is a process group of its own: what it leaves running there once it ends is killed
and reported with its end (conftest's leak guard cannot see a forked process: the environment
/proc shows for it is the server's, not the test's, so it carries no test's mark), and a case
past its time is killed with its group. What a case starts in a session of its own execs
with the case's environment, the test's mark in it, for the leak guard to find.
"""

from __future__ import annotations

import ast
import atexit
import gc
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

# What the server imports before it forks: what `python -m gpumux` imports before it reads its
# arguments, then what a case may import on its way (typer's formatting of a usage error, the
# daemon that `gpumux tune` and `serve` start). In a case's process they would load later, to
# the same effect: the server starts with the environment given it, which the caller makes the
# cases' own but for what gpumux reads when a command runs (test_hostile_args.py checks that,
# and runs a few cases in fresh interpreters too, their imports on their way).
PRELOADED = ("gpumux.main", "typer.rich_utils", "gpumux.server.daemon")
# The variable that tells the server the descriptors of its requests and replies: not 0 and 1,
# which each child takes over for its stdin and stdout.
FDS_VARIABLE = "PYTEST_FORKSERVER_FDS"
# How long what a case started may take to end on its own once the case has ended (as conftest's
# LEFTOVER_GRACE_S).
LEFTOVER_GRACE_S = 5.0
# How long the server may take to answer what is not a case's run: a fork, a group's end.
REPLY_TIMEOUT_S = 60.0
# What the server says once it has imported PRELOADED and takes requests.
READY = b"ready"


class Ended(NamedTuple):
    """How a case ended: its exit code (negative: the signal that ended it), its output, and
    what it left running, killed since (pid: command line)."""

    code: int
    stdout: bytes
    stderr: bytes
    left: dict[int, str]


class StillRunning(Exception):
    """A case past its time, killed with its process group."""

    def __init__(self, timeout: float, left: dict[int, str]) -> None:
        super().__init__(f"still running after {timeout} s")
        # What outlived the case's own kill (nothing, where the group was killed at once).
        self.left = left


class OutOfStep(Exception):
    """The server missed a reply: it is restarted, and the case's end is unknown."""


class ForkServer:
    """One server; a thread at a time uses it. The cases' output goes to files in `directory`;
    the server runs with `env` (what it imports may read it)."""

    def __init__(
        self,
        directory: Path,
        *,
        env: Mapping[str, str],
        reply_timeout: float = REPLY_TIMEOUT_S,
    ) -> None:
        self._directory = directory
        self.environment = dict(env)
        self._reply_timeout = reply_timeout
        self._runs = 0
        # The case in flight (its pid, its process group's id), until its end is read.
        self._case: int | None = None
        self._start()

    def _start(self) -> None:
        requests_read, self._requests = os.pipe()
        self._replies, replies_write = os.pipe()
        # Its stdout not a terminal, as a case's is not (buffering and colour are decided at start).
        self.process = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            pass_fds=(requests_read, replies_write),
            env={**self.environment, FDS_VARIABLE: f"{requests_read},{replies_write}"},
        )
        os.close(requests_read)
        os.close(replies_write)
        self._pending = b""
        # Its imports take their time (seconds on a loaded host), a reply to a request does not:
        # `reply_timeout` is for the replies alone.
        ready = self._line(timeout=REPLY_TIMEOUT_S)
        if ready != READY:
            raise OutOfStep(f"the fork server started with {ready!r}, not {READY!r}")

    def run(
        self,
        argv: Sequence[str | bytes],
        *,
        env: Mapping[str, str],
        cwd: Path,
        timeout: float,
        module: str = "gpumux",
    ) -> Ended:
        """`python -m module *argv` in `cwd` with `env`, and how it ended. StillRunning past
        `timeout`; OutOfStep where the server missed a reply."""
        self._runs += 1
        stdout, stderr = (self._directory / f"{self._runs}.{name}" for name in ("out", "err"))
        request = {
            "module": module,
            "argv": as_argv(argv),
            "env": dict(env),
            "cwd": str(cwd),
            "stdout": str(stdout),
            "stderr": str(stderr),
        }
        os.write(self._requests, json.dumps(request).encode() + b"\n")
        try:
            self._case = int(self._line(timeout=self._reply_timeout))
            try:
                code = int(self._line(timeout=timeout))
            except TimeoutError:
                _kill_group(self._case)
                self._line(timeout=self._reply_timeout)
                raise StillRunning(timeout, self._left()) from None
            left = self._left()
        except (TimeoutError, EOFError, ValueError) as error:
            # A reply missed is read as the next case's, unless the server starts afresh.
            self._restart()
            raise OutOfStep(f"the fork server missed a reply ({error}): restarted") from error
        self._case = None
        return Ended(code, stdout.read_bytes(), stderr.read_bytes(), left)

    def _left(self) -> dict[int, str]:
        """What the case left running, killed: its group's end, which follows the case's."""
        left = json.loads(self._line(timeout=self._reply_timeout))
        self._case = None
        return {int(pid): line for pid, line in left.items()}

    def _line(self, *, timeout: float) -> bytes:
        """The server's next reply."""
        while b"\n" not in self._pending:
            readable, _, _ = select.select([self._replies], [], [], timeout)
            if not readable:
                raise TimeoutError(f"no reply from the fork server within {timeout} s")
            chunk = os.read(self._replies, 4096)
            if not chunk:
                raise EOFError(f"the fork server exited: {self.process.wait()}")
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line

    def close(self) -> None:
        """Stop the server once its case ends; at once, with its case, if it is stuck or a case
        was given up on (pytest-timeout)."""
        os.close(self._requests)
        try:
            if self._case is not None:
                self._kill()
            self.process.wait(timeout=self._reply_timeout)
        except subprocess.TimeoutExpired:
            self._kill()
        finally:
            os.close(self._replies)

    def _kill(self) -> None:
        if self._case is not None:
            _kill_group(self._case)
            self._case = None
        self.process.kill()
        self.process.wait()

    def _restart(self) -> None:
        self._kill()
        os.close(self._requests)
        os.close(self._replies)
        self._start()


def _kill_group(group: int) -> None:
    """SIGKILL every process of `group`, if any is left."""
    with suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


def as_argv(words: Sequence[str | bytes]) -> list[str]:
    """sys.argv[1:] of a case given `words` (bytes decoded as the file system's names are)."""
    return [os.fsdecode(word) for word in words]


def argv_as_the_interpreter_decodes_it(words: Sequence[bytes]) -> list[str]:
    """sys.argv[1:] of a fresh interpreter given `words`."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys; print(ascii(sys.argv[1:]))", *words],
        capture_output=True,
        text=True,
        check=True,
    )
    decoded: list[str] = ast.literal_eval(done.stdout)
    return decoded


def _serve(requests: int, replies: int) -> None:
    """Fork a child per request until the requests' pipe closes; for each, reply its pid, its
    exit code, then what it left running in its process group (killed)."""
    for module in PRELOADED:
        importlib.import_module(module)
    # Left out of the collector's passes: a child that collects garbage does not write to (and
    # so copy) every page of what it shares with the server.
    gc.freeze()
    os.write(replies, READY + b"\n")
    pending = b""
    while True:
        while b"\n" not in pending:
            chunk = os.read(requests, 1 << 20)
            if not chunk:
                return
            pending += chunk
        line, _, pending = pending.partition(b"\n")
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            # First: the group is what a timeout kills, and where leftovers are looked for.
            os.setpgid(0, 0)
            os.close(requests)
            os.close(replies)
            _exit(_become(request))
        os.write(replies, b"%d\n" % pid)
        _, status = os.waitpid(pid, 0)
        os.write(replies, b"%d\n" % os.waitstatus_to_exitcode(status))
        os.write(replies, json.dumps(_left_running(pid)).encode() + b"\n")


def _left_running(group: int) -> dict[int, str]:
    """The processes of `group` still running LEFTOVER_GRACE_S after its leader ended, killed:
    their command lines."""
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while (members := _members(group)) and time.monotonic() < deadline:
        time.sleep(0.05)
    shown = {pid: _command_line(pid) for pid in members}
    if members:
        _kill_group(group)
    return shown


def _members(group: int) -> list[int]:
    """The processes of `group` that run (not those exited, waiting for their parent)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return []
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                # After the command's name, in parentheses: state, parent, group.
                state, _, pgrp = stat.read().rpartition(b")")[2].split()[:3]
        except OSError:
            continue
        if int(pgrp) == group and state not in (b"Z", b"X"):
            found.append(int(name))
    return found


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "(gone)"


def _become(request: dict[str, Any]) -> int:
    """In the child: the case's process, running `python -m` on its module; its exit status."""
    import runpy
    import tempfile

    os.chdir(str(request["cwd"]))
    os.environ.clear()
    os.environ.update(request["env"])
    # Where temporary files go is read from TMPDIR on first use, as in a fresh interpreter.
    tempfile.tempdir = None
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(path, flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    # As `python -m`: the current directory first on the import path.
    sys.path[0] = os.getcwd()
    sys.argv = ["-m", *request["argv"]]
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as exit:
        return _exit_code(exit)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _exit_code(exit: SystemExit) -> int:
    """The exit status the interpreter gives `exit` (a message: printed, and 1)."""
    if exit.code is None or isinstance(exit.code, int):
        return exit.code or 0
    print(exit.code, file=sys.stderr)
    return 1


def _exit(code: int) -> NoReturn:
    """Exit as the interpreter does at its end (waits for the threads that are not daemons, runs
    the atexit handlers, flushes stdout and stderr), without freeing each object of the server's
    it shares: that writes to every page of them, seconds of copying."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


if __name__ == "__main__":
    requests_fd, replies_fd = map(int, os.environ.pop(FDS_VARIABLE).split(","))
    _serve(requests_fd, replies_fd)
