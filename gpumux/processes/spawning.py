"""The daemon's side of the spawner: start it, have it fork supervisors, restart it when it died.

A supervisor forked by the spawner is not the daemon's child: the daemon watches it as it
watches one it adopted (by its pidfd), and the kernel reaps it. When the spawner does not
answer, the launch starts its supervisor directly (see launcher.start_supervisor) and a new
spawner serves the next one.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from gpumux.processes import spawner

log = logging.getLogger(__name__)

SPAWNER_PATH = str(Path(spawner.__file__).resolve())
# Started like the supervisor (see launcher.SUPERVISOR_BOOT): isolated, the package root
# appended to sys.path by hand, the spawner's file first so that ps names it.
SPAWNER_BOOT = (
    "import sys; sys.path.append(sys.argv[1].rsplit('/', 3)[0]); "
    "from gpumux.processes.spawner import main; sys.exit(main(sys.argv[1:]))"
)
# A fork takes a few milliseconds; a spawner silent for this long is hung, and replaced.
ANSWER_TIMEOUT_S = 5.0
# An answer is a pid, or a failure's one-line message.
MAX_ANSWER = 4096


def spawner_command(runs_dir: Path, preload: Sequence[str] = ()) -> list[str]:
    """The command line of a spawner of supervisors for `runs_dir`; `preload`: modules it
    imports before its first fork."""
    preloads = [word for name in preload for word in ("--preload", name)]
    return [sys.executable, "-I", "-S", "-c", SPAWNER_BOOT, SPAWNER_PATH, str(runs_dir), *preloads]


class Spawner:
    """The daemon's spawner: forks the supervisor of a run directory on request; a spawner that
    died is replaced, and when none can start, supervisors are started directly."""

    def __init__(self, *, runs_dir: Path, preload: Sequence[str] = ()) -> None:
        self.runs_dir = runs_dir
        self.preload = tuple(preload)
        self.process: subprocess.Popen[bytes] | None = None
        self._channel: socket.socket | None = None

    def start(self) -> None:
        """Start the spawner process (OSError when it cannot be started)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # Its own session: the terminal's Ctrl-C is the daemon's to handle, not the spawner's.
            self.process = subprocess.Popen(
                spawner_command(self.runs_dir, self.preload),
                stdin=theirs.fileno(),
                env={"PATH": os.defpath},
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.settimeout(ANSWER_TIMEOUT_S)
        self._channel = ours
        log.info("spawner: pid %d forks the supervisors", self.process.pid)

    @property
    def running(self) -> bool:
        return self._channel is not None

    def fork(self, run_dir: Path, go_read: int, own_log: int) -> int | None:
        """The pid of a supervisor forked for `run_dir` with this GO pipe and log; None when
        the spawner did not answer (the caller starts this supervisor itself, and a new spawner
        serves the next). OSError when the spawner could not fork."""
        if self._channel is None:
            return None
        try:
            socket.send_fds(self._channel, [os.fsencode(run_dir)], [go_read, own_log])
            answer = self._channel.recv(MAX_ANSWER)
        except OSError as error:
            self._replace(str(error))
            return None
        if not answer:
            self._replace("it exited")
            return None
        if answer.startswith(spawner.FAILED):
            raise OSError(answer[len(spawner.FAILED) :].decode(errors="replace"))
        return int(answer)

    def _replace(self, why: str) -> None:
        gone = self.process.pid if self.process is not None else None
        self.close(kill=True)
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
        """Stop the spawner (`kill`: now); the supervisors it forked run on."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self.process is not None:
            if kill:
                self.process.kill()
            try:
                self.process.wait(timeout=ANSWER_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None
