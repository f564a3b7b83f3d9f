"""The per-attempt supervisor: owns one trial's processes and outlives the daemon.

The spawner forks it (spawner_process.py), or the daemon starts it isolated (`python -I -S`,
see supervised.supervisor_command), in a session of its own, with the attempt's run directory. It
reads the spec there, starts the trial in a new session (as another user when it is root and
the spec names one), copies the trial's output into the log (rotated at a size cap; output lost
to a full disk is counted and said), beats its heartbeat, and when the trial's leader exits it
kills what is left of the trial and records the exit atomically, once none of its processes
runs. A daemon that restarts reads that record, or adopts a supervisor still running. SIGTERM:
stop the trial (SIGTERM, then SIGKILL after the grace period); SIGUSR1: kill it now.

What is left of the trial is its process group and every process that left it: the supervisor
is a child subreaper, so that a process the trial double-forks after a setsid() is reparented
to it instead of to init, and found among its descendants (reaping.py).

One starts per trial attempt, so it imports little: the standard library, less subprocess and
pathlib (on a 2-core machine their imports cost some 30 ms of CPU per trial; it forks and
execs the trial itself), and from gpumux only the stdlib-only modules that own the run
directory, the log format, process identity, the trial's processes and the trial's start.

How it starts the trial, fresh or preloaded, is trialstart.py's.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time

from gpumux.processes import rundir, trialstart
from gpumux.processes.logfiles import RotatingLog
from gpumux.processes.procfs import descendants, start_ticks
from gpumux.processes.reaping import become_subreaper, reap_orphans, signal_trial

# What the daemon sends on the supervisor's stdin once it has recorded the supervisor's pid.
GO = b"g"
READ_SIZE = 64 * 1024
# After the leader exits, a grandchild outside its group may still hold the output pipe.
DRAIN_SECONDS = 2.0
# While killed processes of the trial are still exiting, how often to look again.
END_POLL_SECONDS = 0.05
# How long killed processes of the trial may take to go before its end is recorded anyway: one
# stuck in the kernel (a hung network mount, a wedged driver) would hold the slot for good.
END_WAIT_SECONDS = 60.0


class Supervisor:
    """One trial attempt, from spawn to its recorded exit."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.spec = rundir.read_spec(run_dir)
        self.kill_at: float | None = None
        self.term_requested = False
        self.kill_requested = False
        # The trial's leader (its pid is the group's id), and its exit status once reaped.
        self.trial: int | None = None
        self.returncode: int | None = None
        # The leader's start ticks, and whether its record waits to be written (a full disk).
        self.leader_started: int | None = None
        self.leader_unrecorded = False

    def run(self) -> int:
        for signum in (signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        if os.read(0, 1) != GO:
            # The daemon died before it recorded this supervisor: the next one will not look
            # for it, and requeues the trial; running it here too would run it twice.
            print("gpumux supervisor: the daemon went away before the start; exiting")
            return 0
        why = become_subreaper()
        if why is not None:
            print(
                f"gpumux supervisor: not a subreaper ({why}): processes that leave the "
                "trial's process group outlive it",
                file=sys.stderr,
            )
        # A signal wakes the select loop through this pipe, so a grace period starts on time.
        wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGUSR1, self._on_kill)
        # An orphan of the trial that exits is this subreaper's to collect: a handler wakes
        # the loop (through the wakeup fd) to do it.
        signal.signal(signal.SIGCHLD, _wake)
        # The daemon starts it with these blocked, so that none arrives before its handler.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGUSR1})
        log = RotatingLog(
            self.spec["log_path"],
            max_bytes=int(self.spec["log_max_bytes"]),
            keep=int(self.spec["log_keep"]),
        )
        log.write(self.spec["banner"].encode())
        lease_file = self.spec.get("lease_file")
        if lease_file is not None and rundir.lease_lapsed(lease_file):
            # Claimed by a daemon frozen between its claim and this GO: another node may
            # have requeued the trial meanwhile.
            with contextlib.suppress(OSError):
                rundir.record_stop(self.run_dir, rundir.LEASE_LAPSED)
            why = "not started: this node's lease on the shared database lapsed before the start"
            log.write(f"gpumux: {why}\n".encode())
            self._record_exit(rundir.ExitStatus(exit_code=None, signal=None), why, log)
            return 0
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            self.trial = pid = trialstart.spawn(self.spec, write_end)
        except trialstart.SpawnError as error:
            log.write(f"gpumux: {error}\n".encode())
            self._record_exit(rundir.ExitStatus(exit_code=None, signal=None), str(error), log)
            return 0
        finally:
            os.close(write_end)
        self.leader_started = start_ticks(pid)
        self.leader_unrecorded = True
        self._record_leader()
        if self.kill_requested:
            self._kill_trial()
        elif self.term_requested:
            self._on_term(signal.SIGTERM, None)
        self._watch(read_end, wake_read, log)
        # Killing the group before reaping the leader: its unreaped pid pins the group id.
        self._end_trial(wake_read, log)
        self._drain(read_end, log)
        self.returncode = returncode = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        self._reap_orphans()
        code, killed_by = (None, -returncode) if returncode < 0 else (returncode, None)
        self._record_exit(rundir.ExitStatus(exit_code=code, signal=killed_by), None, log)
        log.close()
        return 0

    def _record_leader(self) -> None:
        assert self.trial is not None
        try:
            rundir.record_leader(self.run_dir, pid=self.trial, started=self.leader_started)
        except OSError as error:
            # A full disk: the trial runs on; the record is tried again at each heartbeat.
            print(f"gpumux supervisor: cannot record the trial's pid yet: {error}", file=sys.stderr)
        else:
            self.leader_unrecorded = False

    def _record_exit(
        self, exit_status: rundir.ExitStatus, error: str | None, log: RotatingLog
    ) -> None:
        """Write the exit record, waiting for room on a full disk: the result is not lost (nor
        the log's note of output the full disk swallowed)."""
        interval = float(self.spec["heartbeat_interval"])
        ended_at = time.time()
        while True:
            log.write(b"")
            try:
                rundir.record_exit(
                    self.run_dir,
                    trial_id=self.spec["trial_id"],
                    attempt=self.spec["attempt"],
                    exit_status=exit_status,
                    error=error,
                    ended_at=ended_at,
                )
                return
            except OSError as failure:
                with contextlib.suppress(OSError):
                    print(f"gpumux supervisor: cannot record the exit: {failure}", file=sys.stderr)
            rundir.touch_heartbeat(self.run_dir)
            time.sleep(interval)

    def _watch(self, read_end: int, wake_read: int, log: RotatingLog) -> None:
        assert self.trial is not None
        pidfd = os.pidfd_open(self.trial)
        interval = float(self.spec["heartbeat_interval"])
        watched = [read_end, pidfd, wake_read]
        beat_at = lease_at = 0.0
        while True:
            now = time.monotonic()
            if now >= beat_at:
                rundir.touch_heartbeat(self.run_dir)
                if self.leader_unrecorded:
                    self._record_leader()
                beat_at = now + interval
            if now >= lease_at:
                lease_at = now + self._fence(log)
            if self.kill_at is not None and now >= self.kill_at:
                self._kill_trial()
                self.kill_at = None
            timeout = min(beat_at, lease_at) - now
            if self.kill_at is not None:
                timeout = min(timeout, self.kill_at - now)
            ready, _, _ = select.select(watched, [], [], max(0.0, timeout))
            if wake_read in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_read, READ_SIZE)
                self._reap_orphans()
            if read_end in ready and not self._copy(read_end, log):
                watched.remove(read_end)
            if pidfd in ready:
                os.close(pidfd)
                return

    def _fence(self, log: RotatingLog) -> float:
        """Kill the trial once its node's lease on a shared database lapsed: another node may
        requeue it then, and it must not run twice. The daemon renews the lease file at each
        heartbeat; a daemon killed or frozen renews nothing. Returns the seconds until the
        lease must be looked at again."""
        lease_file = self.spec.get("lease_file")
        if lease_file is None or self.returncode is not None:
            return float("inf")
        left = rundir.lease_until(lease_file) - rundir.boottime()
        if left > 0:
            return left
        if rundir.recorded_stop(self.run_dir) is None:
            log.write(
                b"gpumux: this node's lease on the shared database lapsed (its daemon stopped "
                b"renewing it); the trial is stopped so that no other node runs it twice\n"
            )
            # On a full disk the daemon that comes back finds the attempt stopped all the same.
            with contextlib.suppress(OSError):
                rundir.record_stop(self.run_dir, rundir.LEASE_LAPSED)
        self._kill_trial()
        return float("inf")

    def _drain(self, read_end: int, log: RotatingLog) -> None:
        deadline = time.monotonic() + DRAIN_SECONDS
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([read_end], [], [], left)
            if not ready or not self._copy(read_end, log):
                break
        os.close(read_end)

    def _copy(self, read_end: int, log: RotatingLog) -> bool:
        try:
            data = os.read(read_end, READ_SIZE)
        except BlockingIOError:
            return True
        if not data:
            return False
        log.write(data)
        return True

    def _on_term(self, signum: int, frame: object) -> None:
        if self.trial is None:
            self.term_requested = True
            return
        self._signal_trial(signal.SIGTERM)
        if self.kill_at is None:
            self.kill_at = time.monotonic() + float(self.spec["kill_grace"])

    def _on_kill(self, signum: int, frame: object) -> None:
        self.kill_requested = True
        self._kill_trial()

    def _kill_trial(self) -> None:
        if self.trial is not None and self.returncode is None:
            self._signal_trial(signal.SIGKILL)

    def _end_trial(self, wake_read: int, log: RotatingLog) -> None:
        """Once the leader exited: SIGKILL every process of the trial, and wait until none
        runs (a process in the kernel, releasing a GPU, may take a while): its end is
        recorded, and its device counted free, only then."""
        assert self.trial is not None
        interval = float(self.spec["heartbeat_interval"])
        beat_at = time.monotonic() + interval
        escaped, refused = signal_trial(self.trial, signal.SIGKILL)
        give_up_at = time.monotonic() + END_WAIT_SECONDS
        while left := descendants(os.getpid()) - refused - {self.trial}:
            if time.monotonic() >= give_up_at:
                log.write(
                    f"gpumux: pids {sorted(left)} of the trial did not go within "
                    f"{END_WAIT_SECONDS:.0f} s of SIGKILL (stuck in the kernel?); its end is "
                    "recorded without them\n".encode()
                )
                break
            ready, _, _ = select.select([wake_read], [], [], END_POLL_SECONDS)
            if ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_read, READ_SIZE)
            self._reap_orphans()
            if time.monotonic() >= beat_at:
                rundir.touch_heartbeat(self.run_dir)
                beat_at = time.monotonic() + interval
            more, not_ours = signal_trial(self.trial, signal.SIGKILL)
            escaped |= more
            refused |= not_ours
        if escaped:
            log.write(
                f"gpumux: killed {len(escaped)} process(es) the trial left running outside "
                "its process group\n".encode()
            )
        if refused:
            log.write(
                f"gpumux: could not kill pids {sorted(refused)} (another user's: set-user-ID "
                "programs the trial started); they run on\n".encode()
            )

    def _reap_orphans(self) -> None:
        reap_orphans(leader=self.trial if self.returncode is None else None)

    def _signal_trial(self, signum: int) -> None:
        assert self.trial is not None
        signal_trial(self.trial, signum)


def _wake(signum: int, frame: object) -> None:
    """SIGCHLD's handler: its signal wakes the loop through the wakeup fd; the loop reaps."""


def main(argv: list[str]) -> int:
    """Supervise the attempt of the run directory in `argv` (its file, then RUN_DIR)."""
    if len(argv) != 2:
        print("usage: supervisor.py RUN_DIR (started by the gpumux daemon)", file=sys.stderr)
        return 2
    return Supervisor(argv[1]).run()
