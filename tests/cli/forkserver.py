"""`python -m gpumux` run hundreds of times, each a process of its own, without importing gpumux
each time (0.8 s of CPU a start, most of a hostile argument's case).

A server, this file run by the interpreter, imports gpumux (PRELOADED), then forks a child per
command line: the child takes the case's directory, environment, argv, stdin from /dev/null and
stdout and stderr into files, runs the `gpumux` module as `python -m` does and exits as the
interpreter exits (see _exit). Its argv is decoded as the interpreter decodes its own
(os.fsdecode: the file system's encoding, undecodable bytes as surrogates;
argv_as_the_interpreter_decodes_it checks it).
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
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

# What the server imports before it forks: what `python -m gpumux` imports before it reads its
# arguments, then what a case may import on its way (typer's formatting of a usage error, the
# daemon that `gpumux tune` and `serve` start). In a case's process they would load later, to
# the same effect: a case's environment differs from the server's only in GPUMUX_HOME,
# GPUMUX_URL, XDG_CONFIG_HOME and TMPDIR, which gpumux reads when a command runs.
PRELOADED = ("gpumux.main", "typer.rich_utils", "gpumux.server.daemon")
# The variable that tells the server the descriptors of its requests and replies: not 0 and 1,
# which each child takes over for its stdin and stdout.
FDS_VARIABLE = "PYTEST_FORKSERVER_FDS"


class ForkServer:
    """One server; a thread at a time uses it. The cases' output goes to files in `directory`."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._runs = 0
        requests_read, self._requests = os.pipe()
        self._replies, replies_write = os.pipe()
        # Its stdout not a terminal, as a case's is not (buffering and colour are decided at start).
        self.process = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            pass_fds=(requests_read, replies_write),
            env={**os.environ, FDS_VARIABLE: f"{requests_read},{replies_write}"},
        )
        os.close(requests_read)
        os.close(replies_write)
        self._pending = b""

    def run(
        self,
        argv: Sequence[str | bytes],
        *,
        env: Mapping[str, str],
        cwd: Path,
        timeout: float,
    ) -> tuple[int, bytes, bytes]:
        """`python -m gpumux *argv` in `cwd` with `env`: its exit code (negative: the signal
        that ended it), stdout and stderr. TimeoutError past `timeout`, the child killed."""
        self._runs += 1
        stdout, stderr = (self._directory / f"{self._runs}.{name}" for name in ("out", "err"))
        request = {
            "argv": as_argv(argv),
            "env": dict(env),
            "cwd": str(cwd),
            "stdout": str(stdout),
            "stderr": str(stderr),
        }
        os.write(self._requests, json.dumps(request).encode() + b"\n")
        pid = int(self._line(timeout=60))
        try:
            code = int(self._line(timeout=timeout))
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            self._line(timeout=60)
            raise
        return code, stdout.read_bytes(), stderr.read_bytes()

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
        os.close(self._requests)
        self.process.wait(timeout=60)
        os.close(self._replies)


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
    """Fork a child per request until the requests' pipe closes; for each, reply its pid, then
    its exit code."""
    for module in PRELOADED:
        importlib.import_module(module)
    # Left out of the collector's passes: a child that collects garbage does not write to (and
    # so copy) every page of what it shares with the server.
    gc.freeze()
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
            os.close(requests)
            os.close(replies)
            _exit(_become(request))
        os.write(replies, b"%d\n" % pid)
        _, status = os.waitpid(pid, 0)
        os.write(replies, b"%d\n" % os.waitstatus_to_exitcode(status))


def _become(request: dict[str, Any]) -> int:
    """In the child: the case's process, running `python -m gpumux`; its exit status."""
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
        runpy.run_module("gpumux", run_name="__main__", alter_sys=True)
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
