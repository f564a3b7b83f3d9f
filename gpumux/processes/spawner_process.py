"""The spawner: a long-lived helper that forks trial supervisors, so that none pays an
interpreter's start and its imports (some 25 ms of CPU per trial on a 2-core machine).

The daemon starts one (`python -I -S`, see spawner_client.spawner_command) in a session of its own,
with one end of a Unix socket as its stdin and its runs directory on its command line (which
its supervisors, forked without an exec, share: ps names the daemon's data directory for each
of them). Each request is a run directory in that directory and two
descriptors: the read end of the supervisor's GO pipe and its own log. The spawner forks; the
child becomes the supervisor of that run directory, exactly as a freshly started one would be
(its own session, the GO pipe as stdin, the log as stdout and stderr, SIGTERM and SIGUSR1 held
until its handlers are in place), and the spawner answers with its pid. The kernel reaps the
supervisors it forks (SIGCHLD ignored), so none lingers as a zombie while it runs, and a
supervisor does not depend on it: if the spawner dies, its supervisors run on, like any orphan.
The spawner exits when the daemon closes its end.

`--preload MODULE` imports a module before the first fork, so that every supervisor (and what
it forks) starts with it loaded: the preloading spawner preloads the framework (see
spawner_client.py). Once its preloads are done the spawner says READY, before it reads the first
request; a preload that fails is said instead (FAILED and why), and the spawner exits.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from typing import NoReturn

from gpumux.processes import supervisor

# A request's run directory fits in this many bytes (a path, at most PATH_MAX).
MAX_REQUEST = 4096
# The descriptors each request carries: the GO pipe's read end, then the supervisor's log.
REQUEST_FDS = 2
# The first byte of an answer that reports a failure instead of a pid.
FAILED = b"!"
# The spawner's first message: its preloads are imported, it serves requests.
READY = b"ready"
# Held in the spawner, and so in every supervisor from its first instruction, until the
# supervisor's handlers are in place: an early stop must not kill it.
HELD_SIGNALS = {signal.SIGTERM, signal.SIGUSR1}


def serve(channel: socket.socket, runs_dir: str) -> int:
    """Answer the daemon's requests for run directories in `runs_dir` until it closes its end."""
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(channel, MAX_REQUEST, REQUEST_FDS)
        except ConnectionError:
            return 0
        if not message:
            return 0
        try:
            run_dir = os.fsdecode(message)
            if len(fds) != REQUEST_FDS:
                answer = FAILED + b"a request carries the GO pipe and the log"
            elif not is_run_dir(run_dir, runs_dir):
                answer = FAILED + f"{run_dir!r} is not a run directory of {runs_dir}".encode()
            else:
                answer = b"%d" % fork_supervisor(channel, run_dir, *fds)
        except OSError as error:
            answer = FAILED + str(error).encode(errors="replace")
        finally:
            for fd in fds:
                os.close(fd)
        try:
            channel.send(answer)
        except ConnectionError:
            return 0


def is_run_dir(run_dir: str, runs_dir: str) -> bool:
    """Whether `run_dir` names a directory right inside `runs_dir` (not `.` nor `..`, nor
    through a link that leads elsewhere)."""
    if os.path.basename(run_dir) in ("", ".", ".."):
        return False
    parent = os.path.realpath(os.path.dirname(run_dir))
    return parent == os.path.realpath(runs_dir) == os.path.dirname(os.path.realpath(run_dir))


def fork_supervisor(channel: socket.socket, run_dir: str, go_read: int, own_log: int) -> int:
    """Fork the supervisor of `run_dir`; its pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        become_supervisor(channel, run_dir, go_read, own_log)
    return pid


def become_supervisor(channel: socket.socket, run_dir: str, go_read: int, own_log: int) -> NoReturn:
    """In the forked child: become the supervisor of `run_dir`, and never return."""
    code = 1
    try:
        # The daemon's socket is not the supervisor's: dropped without a close of the object,
        # which could close a later descriptor of the same number.
        channel.detach()
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.dup2(go_read, 0)
        os.dup2(own_log, 1)
        os.dup2(own_log, 2)
        os.close(go_read)
        os.close(own_log)
        code = supervisor.main([supervisor.__file__, run_dir])
    except BaseException:
        sys.excepthook(*sys.exc_info())
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main(argv: list[str]) -> int:
    """Serve the daemon on stdin (argv: this file, RUNS_DIR, `--preload MODULE` any number of
    times)."""
    args = argv[2:]
    if len(argv) < 2 or len(args) % 2 or any(flag != "--preload" for flag in args[::2]):
        print("usage: spawner_process.py RUNS_DIR [--preload MODULE]... (started by gpumux)")
        return 2
    channel = socket.socket(fileno=0)
    for name in args[1::2]:
        try:
            __import__(name)
        except Exception as error:
            channel.send(FAILED + f"cannot import {name}: {error!r}".encode(errors="replace"))
            return 1
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    try:
        channel.send(READY)
    except ConnectionError:
        return 0
    return serve(channel, argv[1])
