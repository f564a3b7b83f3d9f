"""The daemon's side of the spawner: start it, have it fork supervisors, restart it when it died.

A supervisor forked by the spawner is not the daemon's child: the daemon watches it as it
watches one it adopted (by its pidfd), and the kernel reaps it. When the spawner does not
answer, the launch starts its supervisor directly (see supervised.start_supervisor) and a new
spawner serves the next one; when it answers that it could not fork, the same launch starts
directly too.

The preloading spawner is a second one, for the trials of `--preload` sweeps: `python -I` with the
daemon's own site-packages (so the framework imports; no PYTHONPATH, no user site: each trial
adds its own) and the daemon's LD_LIBRARY_PATH and LD_PRELOAD; it preloads gpumux.runtime.preloaded
and the framework, so the supervisors it forks start their trials without an exec (see
trialstart.py). Its imports take seconds: it starts on the first --preload trial, and until it says
it is ready, --preload trials start fresh from the ordinary spawner.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from gpumux.processes import spawner_process, trialstart

log = logging.getLogger(__name__)

SPAWNER_PATH = str(Path(spawner_process.__file__).resolve())
# Started like the supervisor (see supervised.SUPERVISOR_BOOT): isolated, the package root
# appended to sys.path by hand, the spawner's file first so that ps names it.
SPAWNER_BOOT = (
    "import sys; sys.path.append(sys.argv[1].rsplit('/', 3)[0]); "
    "from gpumux.processes.spawner_process import main; sys.exit(main(sys.argv[1:]))"
)
# The preloading spawner runs with site-packages, where another gpumux may be installed (an editable
# install of another checkout): its own package is imported first from its root, and the root
# is then taken off sys.path, so that nothing else there shadows a module.
PRELOADING_BOOT = (
    "import sys; r = sys.argv[1].rsplit('/', 3)[0]; sys.path.insert(0, r); import gpumux; "
    "sys.path.remove(r); from gpumux.processes.spawner_process import main; "
    "sys.exit(main(sys.argv[1:]))"
)
# The loader's settings the preloading spawner keeps from the daemon's environment (see
# preloaded.LOADER_VARIABLES: a trial whose own differ starts fresh).
LOADER_VARIABLES = ("LD_LIBRARY_PATH", "LD_PRELOAD")
# A fork takes a few milliseconds; a spawner silent for this long is hung, and replaced.
ANSWER_TIMEOUT_S = 5.0
# An answer is a pid, or a failure's one-line message.
MAX_ANSWER = 4096


def spawner_command(
    runs_dir: Path, preload: Sequence[str] = (), *, preloading: bool = False
) -> list[str]:
    """The command line of a spawner of supervisors for `runs_dir`; `preload`: modules it
    imports before its first fork; `preloading`: with site-packages, for --preload trials."""
    preloads = [word for name in preload for word in ("--preload", name)]
    # -u: a preloaded trial keeps the interpreter's streams, and its output must reach the log as it
    # is printed, as PYTHONUNBUFFERED (the contract) makes it in a fresh one.
    flags, boot = (["-I", "-u"], PRELOADING_BOOT) if preloading else (["-I", "-S"], SPAWNER_BOOT)
    return [sys.executable, *flags, "-c", boot, SPAWNER_PATH, str(runs_dir), *preloads]


class Spawner:
    """The daemon's spawner: forks the supervisor of a run directory on request; a spawner that
    died is replaced, and when none can start, supervisors are started directly."""

    def __init__(
        self,
        *,
        runs_dir: Path,
        preload: Sequence[str] = (),
        preloading: bool = False,
        preloading_spawner: Spawner | None = None,
    ) -> None:
        self.runs_dir = runs_dir
        self.preload = tuple(preload)
        self.preloading = preloading
        # The spawner of --preload trials, started on the first that asks for it (see serving).
        self.preloading_spawner = preloading_spawner
        # Why this spawner cannot serve (a preload that failed): it is not started again.
        self.failed: str | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._channel: socket.socket | None = None
        self._ready = False

    @classmethod
    def with_preloading(cls, *, runs_dir: Path, preload: Sequence[str]) -> Spawner:
        """The daemon's spawner, with a preloading spawner that preloads `preload`."""
        preloading = cls(
            runs_dir=runs_dir, preload=(trialstart.PRELOADED_MODULE, *preload), preloading=True
        )
        return cls(runs_dir=runs_dir, preloading_spawner=preloading)

    def start(self) -> None:
        """Start the spawner process (OSError when it cannot be started)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # Its own session: the terminal's Ctrl-C is the daemon's to handle, not the spawner's.
            self.process = subprocess.Popen(
                spawner_command(self.runs_dir, self.preload, preloading=self.preloading),
                stdin=theirs.fileno(),
                env=self._environment(),
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.settimeout(ANSWER_TIMEOUT_S)
        self._channel = ours
        self._ready = False
        if self.preloading:
            log.info(
                "preloading spawner: pid %d imports %s; --preload trials start fresh until it is "
                "ready",
                self.process.pid,
                ", ".join(self.preload),
            )
        else:
            log.info("spawner: pid %d forks the supervisors", self.process.pid)

    def _environment(self) -> dict[str, str]:
        # The preloading spawner loads the framework's libraries for its trials: with the daemon's
        # loader settings (CUDA from an environment module), which a trial's usually match.
        env = {"PATH": os.defpath}
        if self.preloading:
            env.update({name: os.environ[name] for name in LOADER_VARIABLES if name in os.environ})
        return env

    @property
    def name(self) -> str:
        """What the log calls it."""
        return "preloading spawner" if self.preloading else "spawner"

    @property
    def running(self) -> bool:
        return self._channel is not None

    def serving(self, *, preload: bool) -> Spawner:
        """The spawner that forks a trial's supervisor: for a --preload trial the preloading
        spawner once it is ready (started here on the first that asks), else this one."""
        partner = self.preloading_spawner
        if not preload or partner is None or partner.failed is not None:
            return self
        if not partner.running:
            try:
                partner.start()
            except OSError as error:
                partner.failed = str(error)
                log.warning(
                    "preloading spawner: cannot start (%s); --preload trials start fresh", error
                )
                return self
        return partner if partner.is_ready() else self

    def is_ready(self) -> bool:
        """Whether the spawner has said it is ready (its preloads imported); never waits. One
        that failed is closed, its reason in `failed`."""
        if self._ready or self._channel is None:
            return self._ready
        if not select.select([self._channel], [], [], 0)[0]:
            return False
        try:
            expect_ready(self._channel.recv(MAX_ANSWER))
        except OSError as error:
            self.failed = str(error)
            log.error(
                "%s: pid %s cannot serve (%s); its trials start fresh: install what it imports "
                "in the daemon's environment, or set GPUMUX_PRELOAD",
                self.name,
                self.process.pid if self.process is not None else None,
                error,
            )
            self._stop(kill=True)
            return False
        self._ready = True
        log.info("%s: ready", self.name)
        return True

    def fork(self, run_dir: Path, go_read: int, own_log: int) -> int | None:
        """The pid of a supervisor forked for `run_dir` with this GO pipe and log; None when
        the spawner did not answer (a new spawner serves the next) or could not fork: the
        caller starts this supervisor itself."""
        if self._channel is None:
            return None
        try:
            if not self._ready:
                expect_ready(self._channel.recv(MAX_ANSWER))
                self._ready = True
            socket.send_fds(self._channel, [os.fsencode(run_dir)], [go_read, own_log])
            answer = self._channel.recv(MAX_ANSWER)
        except OSError as error:
            self._replace(str(error))
            return None
        if not answer:
            self._replace("it exited")
            return None
        if answer.startswith(spawner_process.FAILED):
            # It could not fork (EAGAIN at a process limit): a direct start may still succeed.
            log.warning(
                "%s: could not fork the supervisor of %s (%s); it starts directly",
                self.name,
                run_dir,
                answer[len(spawner_process.FAILED) :].decode(errors="replace"),
            )
            return None
        return int(answer)

    def _replace(self, why: str) -> None:
        gone = self.process.pid if self.process is not None else None
        self._stop(kill=True)
        try:
            self.start()
        except OSError as error:
            log.error(
                "spawner: pid %s did not answer (%s) and no new one starts (%s); starting "
                "supervisors directly from now on",
                gone,
                why,
                error,
            )
            return
        log.warning(
            "spawner: pid %s did not answer (%s); this supervisor starts directly, the next "
            "from the new spawner",
            gone,
            why,
        )

    def close(self, *, kill: bool = False) -> None:
        """Stop the spawner and its preloading spawner (`kill`: now); the supervisors they forked
        run on."""
        if self.preloading_spawner is not None:
            self.preloading_spawner.close(kill=kill)
        self._stop(kill=kill)

    def _stop(self, *, kill: bool) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self.process is not None:
            # One still importing its preloads serves no one, and would not see the close yet.
            if kill or not self._ready:
                self.process.kill()
            try:
                self.process.wait(timeout=ANSWER_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


def expect_ready(message: bytes) -> None:
    """OSError unless `message` is a spawner's READY: it exited, or said why it cannot serve."""
    if message == spawner_process.READY:
        return
    if not message:
        raise ConnectionResetError("it exited before it was ready")
    if message.startswith(spawner_process.FAILED):
        raise OSError(message[len(spawner_process.FAILED) :].decode(errors="replace"))
    raise OSError(f"it said {message[:100]!r} instead of {spawner_process.READY!r}")
