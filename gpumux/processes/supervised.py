"""Supervised trials from the daemon's side: start a supervisor, watch it, adopt it, stop it."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shlex
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumux.processes import rundir, supervisor
from gpumux.processes.contract import LaunchSpec, trial_env
from gpumux.processes.procfs import kill_marked, kill_orphans, start_ticks
from gpumux.processes.rundir import TrialEnd
from gpumux.processes.spawner_client import Spawner

log = logging.getLogger(__name__)

SUPERVISOR_PATH = str(Path(supervisor.__file__).resolve())
# -I -S: the submitter's environment (PYTHONPATH, a user site) cannot change what the supervisor
# runs, and no site module is imported per trial. So the package root is put on sys.path by
# hand: appended, so that nothing beside gpumux there shadows the standard library. The
# supervisor's file is the first argument, from which the root is found, so that ps names it.
SUPERVISOR_BOOT = (
    "import sys; sys.path.append(sys.argv[1].rsplit('/', 3)[0]); "
    "from gpumux.processes.supervisor import main; sys.exit(main(sys.argv[1:]))"
)


def supervisor_command(run_dir: Path) -> list[str]:
    """The command line of the supervisor of the attempt whose run directory is `run_dir`."""
    return [sys.executable, "-I", "-S", "-c", SUPERVISOR_BOOT, SUPERVISOR_PATH, str(run_dir)]


class LaunchError(RuntimeError):
    """The trial could not be started; the message says why and how to fix it."""


@dataclass(frozen=True)
class SupervisorOptions:
    """How a supervisor watches its trial: grace period, heartbeat, log cap."""

    kill_grace: float
    heartbeat_interval: float
    log_max_bytes: int
    log_keep: int
    # The node's lease file on a shared database; None where no other node can take trials.
    lease_file: str | None = None


class SupervisedTrial:
    """One trial attempt, watched through its supervisor: a process that outlives the daemon."""

    def __init__(
        self,
        *,
        trial_id: int,
        attempt: int,
        run_dir: Path,
        pid: int,
        started: int | None,
        child: bool = False,
    ) -> None:
        self.trial_id = trial_id
        self.attempt = attempt
        self.run_dir = run_dir
        self.pid = pid
        self.started = started
        # Our own child until collected; an adopted supervisor is init's to reap.
        self.child = child
        self.pidfd = _pidfd_open(pid)
        self._leader: tuple[int, int | None] | None = None

    @classmethod
    def spawn(
        cls,
        spec: LaunchSpec,
        *,
        run_dir: Path,
        options: SupervisorOptions,
        user: Mapping[str, Any] | None = None,
        spawner: Spawner | None = None,
    ) -> SupervisedTrial:
        """Write the attempt's spec into `run_dir` and start its supervisor in a new session:
        forked by `spawner` when it answers, else started afresh."""
        try:
            spec.log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.close(os.open(spec.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        except OSError as error:
            raise LaunchError(f"cannot write the trial's log {spec.log_path}: {error}") from error
        try:
            run_dir.mkdir(mode=0o700, parents=True)
            rundir.write_spec(run_dir, supervisor_spec(spec, options=options, user=user))
            pid, go_write, child = start_supervisor(run_dir, spawner=spawner)
        except OSError as error:
            raise LaunchError(
                f"cannot start the trial's supervisor in {run_dir}: {error}"
            ) from error
        started = start_ticks(pid)
        try:
            # On record before the trial starts: a daemon that dies at any moment leaves either
            # a recorded supervisor to adopt, or one that exits without running anything.
            rundir.record_supervisor(run_dir, pid=pid, started=started)
            os.write(go_write, supervisor.GO)
        except OSError as error:
            # Without its GO byte the supervisor exits at once, having run nothing: collect it.
            os.close(go_write)
            if child:
                os.waitpid(pid, 0)
            raise LaunchError(
                f"cannot record the trial's supervisor in {run_dir}: {error}"
            ) from error
        os.close(go_write)
        # %a: a command word may hold a line break, which must not start a line of its own here.
        log.info("trial %s: supervisor pid %d: %a", spec.trial_id, pid, shlex.join(spec.argv))
        return cls(
            trial_id=spec.trial_id,
            attempt=spec.attempt,
            run_dir=run_dir,
            pid=pid,
            started=started,
            child=child,
        )

    @classmethod
    def find(cls, *, trial_id: int, attempt: int, run_dir: Path) -> SupervisedTrial | None:
        """The live supervisor of this attempt, as recorded in its run directory, if any."""
        record = rundir.recorded_supervisor(run_dir)
        if record is None or record.started is None or not record.this_boot():
            return None
        return cls.adopt(
            trial_id=trial_id,
            attempt=attempt,
            run_dir=run_dir,
            pid=record.pid,
            started=record.started,
        )

    @classmethod
    def adopt(
        cls, *, trial_id: int, attempt: int, run_dir: Path, pid: int, started: int
    ) -> SupervisedTrial | None:
        """The supervisor a previous daemon started, if that very process still runs."""
        if start_ticks(pid, living=True) != started:
            return None
        adopted = cls(trial_id=trial_id, attempt=attempt, run_dir=run_dir, pid=pid, started=started)
        # It may have exited between the two looks: then its pid could name another process.
        if adopted.pidfd is None or start_ticks(pid, living=True) != started:
            adopted.close()
            return None
        return adopted

    def exited(self) -> bool:
        """Whether the supervisor has exited (it writes the trial's end before it does)."""
        if self.child:
            try:
                result = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return True
            return result is not None
        if self.pidfd is not None:
            return bool(select.select([self.pidfd], [], [], 0)[0])
        return start_ticks(self.pid) != self.started

    @property
    def leader(self) -> tuple[int, int | None] | None:
        """The trial's leader (pid = process group id) and its start ticks, once started."""
        if self._leader is None:
            record = rundir.recorded_leader(self.run_dir)
            if record is not None:
                self._leader = (record.pid, record.started)
        return self._leader

    @property
    def pgid(self) -> int | None:
        return None if self.leader is None else self.leader[0]

    def heartbeat(self) -> float | None:
        """When the supervisor last beat (the file's mtime, as a marker); None before the first."""
        return rundir.last_heartbeat(self.run_dir)

    def end(self) -> TrialEnd | None:
        """What the supervisor recorded of the trial's end; None when it died without saying."""
        return rundir.recorded_end(self.run_dir, self.attempt)

    def finish(self) -> TrialEnd | None:
        """After the supervisor exited: collect it, kill any leftovers, read the trial's end.
        Its pidfd stays open for its watcher to close (`close`), where it watched it."""
        if self.child:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.child = False
        end = self.end()
        if end is None:
            self.kill_leftovers()
        return end

    def note_stop(self, reason: str) -> None:
        """Record why gpumux stops this trial, for a daemon that adopts it or its end later."""
        with contextlib.suppress(OSError):
            rundir.record_stop(self.run_dir, reason)

    def terminate(self) -> None:
        """Ask the supervisor to stop the trial: SIGTERM now, SIGKILL after its grace period."""
        self._signal_supervisor(signal.SIGTERM)

    def kill(self) -> None:
        """Kill the trial's group now, and make sure its supervisor does too."""
        self.kill_leftovers()
        self._signal_supervisor(signal.SIGUSR1)

    def kill_supervisor(self) -> None:
        """The supervisor stopped answering: kill it and its trial."""
        self.kill_leftovers()
        self._signal_supervisor(signal.SIGKILL)

    def kill_leftovers(self) -> None:
        """SIGKILL what is left of the trial: its process group and its processes outside it."""
        kill_leftovers(self.trial_id, self.run_dir)

    def _signal_supervisor(self, signum: int) -> None:
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signum)
            elif start_ticks(self.pid) == self.started:
                os.kill(self.pid, signum)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def supervisor_spec(
    spec: LaunchSpec, *, options: SupervisorOptions, user: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Everything the supervisor needs to start and watch the attempt (its spec.json)."""
    return {
        "trial_id": spec.trial_id,
        "attempt": spec.attempt,
        "argv": list(spec.argv),
        "cwd": spec.workdir,
        "env": trial_env(spec),
        "cpu_affinity": None if spec.cpu_affinity is None else list(spec.cpu_affinity),
        "user": dict(user) if user is not None else None,
        "log_path": str(spec.log_path),
        "log_max_bytes": options.log_max_bytes,
        "log_keep": options.log_keep,
        "kill_grace": options.kill_grace,
        "heartbeat_interval": options.heartbeat_interval,
        "lease_file": options.lease_file,
        "preload": spec.preload,
        "banner": f"gpumux: trial {spec.trial_id} attempt {spec.attempt} on "
        f"{spec.device_kind} split {spec.split}: {shlex.join(spec.argv)}\n",
    }


def start_supervisor(run_dir: Path, *, spawner: Spawner | None = None) -> tuple[int, int, bool]:
    """Start the supervisor of `run_dir` in a session of its own: its pid, the write end of its
    stdin, on which it waits for the GO byte before it starts the trial, and whether it is our
    child (one the spawner forked is not)."""
    own_log = os.open(
        run_dir / rundir.SUPERVISOR_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
    )
    try:
        if spawner is not None:
            forked = with_go_pipe(lambda go_read: spawner.fork(run_dir, go_read, own_log))
            if forked is not None:
                return (*forked, False)
        spawned = with_go_pipe(lambda go_read: spawn_supervisor(run_dir, go_read, own_log))
        assert spawned is not None
        return (*spawned, True)
    finally:
        os.close(own_log)


def with_go_pipe(start: Callable[[int], int | None]) -> tuple[int, int] | None:
    """Start a supervisor with `start`, given the read end of a new GO pipe: its pid and the
    write end, or None when `start` started none (that pipe is closed, so that a supervisor
    started all the same reads its end and exits without running anything)."""
    go_read, go_write = os.pipe2(os.O_CLOEXEC)
    try:
        pid = start(go_read)
    except BaseException:
        os.close(go_write)
        raise
    finally:
        os.close(go_read)
    if pid is None:
        os.close(go_write)
        return None
    return pid, go_write


def spawn_supervisor(run_dir: Path, go_read: int, own_log: int) -> int:
    """Start a fresh supervisor interpreter for `run_dir`; its pid."""
    # Not subprocess.Popen: a supervisor left running at a graceful stop is no leak.
    return os.posix_spawn(
        sys.executable,
        supervisor_command(run_dir),
        {"PATH": os.defpath},
        file_actions=[
            (os.POSIX_SPAWN_DUP2, go_read, 0),
            (os.POSIX_SPAWN_DUP2, own_log, 1),
            (os.POSIX_SPAWN_DUP2, own_log, 2),
        ],
        setsid=True,
        # Held until its handlers are in place: an early stop must not kill it.
        setsigmask={signal.SIGTERM, signal.SIGUSR1},
    )


def kill_leftovers(
    trial_id: int, run_dir: Path, *, pgid: int | None = None, started: int | None = None
) -> None:
    """SIGKILL what is left of an attempt, as its run directory names it: its process group
    (or the one given, for a trial started before supervisors kept one), and the processes
    that left the group but carry the attempt's report token in their environment (its
    supervisor, their subreaper, is gone: no one's tree holds them any more)."""
    record = rundir.recorded_leader(run_dir)
    if record is not None and not record.this_boot():
        return  # the machine rebooted since: those processes are long gone
    if record is not None and record.started is not None:
        pgid, started = record.pid, record.started
    killed = []
    if pgid is not None and started is not None:
        killed += kill_orphans(pgid=pgid, started=started)
    marker = _attempt_marker(run_dir)
    if marker is not None:
        supervised = rundir.recorded_supervisor(run_dir)
        since = started or (supervised.started if supervised is not None else None) or 0
        killed += kill_marked(marker, since=since)
    for pid in sorted(set(killed)):
        log.warning("trial %s: pid %d outlived its supervisor; killed it", trial_id, pid)


def _attempt_marker(run_dir: Path) -> bytes | None:
    """The environment entry that only this attempt's processes carry: its report token."""
    try:
        token = rundir.read_spec(run_dir)["env"]["GPUMUX_TRIAL_TOKEN"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return f"GPUMUX_TRIAL_TOKEN={token}".encode()


def _pidfd_open(pid: int) -> int | None:
    # A pidfd turns readable when the process exits: the scheduler wakes on it instead of polling.
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
