"""The trial attempts a scheduler watches: their supervisors, and when to step in on each."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from gpumux.processes.rundir import TrialEnd
from gpumux.processes.supervised import SupervisedTrial
from gpumux.scheduling.outcomes import StopReason

log = logging.getLogger(__name__)

# The supervisor kills a trial at the grace period; the daemon steps in this much later.
KILL_BACKSTOP_S = 5.0
# How soon to look again for the pid of a trial whose supervisor is starting it.
LEADER_POLL_S = 0.05
LEADER_POLL_FOR_S = 2.0


@dataclass
class Running:
    """A supervised trial the scheduler watches, and why it is being stopped, if it is."""

    process: SupervisedTrial
    sweep_id: int
    memory_limit_mb: int | None
    deadline: float | None
    stop: StopReason | None = None
    kill_at: float | None = None
    leader_recorded: bool = False
    watched_since: float = field(default_factory=time.monotonic)
    # The supervisor's last heartbeat seen, and when (monotonic) it was first seen.
    beat: float | None = None
    beat_seen: float = field(default_factory=time.monotonic)


class Watched:
    """Supervised trial attempts by trial id. A supervisor's exit wakes the event loop (through
    its pidfd); deadlines, grace periods and heartbeats are checked when the loop asks.

    The scheduler's tick adds and collects attempts in its own thread; the pidfds are watched
    by the event loop, which alone registers them and alone closes them: `sync_readers`, on
    the loop after each of the tick's calls, follows what the tick changed. An fd closed by the
    tick's thread could be given to a connection the loop accepts before the sync, whose
    reader would then land on the stale entry and never be polled."""

    def __init__(self, *, kill_grace: float, heartbeat_timeout: float) -> None:
        self.kill_grace = kill_grace
        self.heartbeat_timeout = heartbeat_timeout
        self._entries: dict[int, Running] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_exit: Callable[[], None] = lambda: None
        # On the loop only: the pidfds it watches, and those whose exit it has seen.
        self._readers: dict[int, SupervisedTrial] = {}
        self._fired: dict[int, SupervisedTrial] = {}
        # Attempts the tick stopped watching, whose pidfds the loop closes at its next sync.
        self._retired: list[SupervisedTrial] = []
        self._retired_lock = threading.Lock()

    def attach(self, loop: asyncio.AbstractEventLoop, on_exit: Callable[[], None]) -> None:
        """Watch supervisors' exits from `loop`, calling `on_exit` when one exits."""
        self._loop, self._on_exit = loop, on_exit
        self.sync_readers()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, trial_id: object) -> bool:
        return trial_id in self._entries

    def __getitem__(self, trial_id: int) -> Running:
        return self._entries[trial_id]

    def items(self) -> Iterator[tuple[int, Running]]:
        return iter(list(self._entries.items()))

    def add(self, trial_id: int, entry: Running) -> None:
        """Watch a trial attempt from now on."""
        self._entries[trial_id] = entry

    def collect_exited(self) -> list[tuple[int, Running, TrialEnd | None]]:
        """The attempts whose supervisors exited, no longer watched, each with its recorded end
        (None: the supervisor died without recording one)."""
        ended = []
        for trial_id, entry in self.items():
            if entry.process.exited():
                ended.append((trial_id, entry, entry.process.finish()))
                del self._entries[trial_id]
                self._retire(entry.process)
        return ended

    def _retire(self, process: SupervisedTrial) -> None:
        """No longer watched: its pidfd is closed by the loop (at once when there is none)."""
        if self._loop is None or self._loop.is_closed():
            process.close()
            return
        with self._retired_lock:
            self._retired.append(process)

    def new_leaders(self) -> dict[int, tuple[int, int | None]]:
        """Trials whose command started since the last look: their leader pid and start ticks."""
        return {
            trial_id: leader
            for trial_id, entry in self._entries.items()
            if not entry.leader_recorded and (leader := entry.process.leader) is not None
        }

    def stop(self, trial_id: int, reason: StopReason, *, immediate: bool = False) -> None:
        """Have the supervisor SIGTERM the trial's group now and SIGKILL it after the grace
        period (at once if immediate); the daemon kills it itself if the supervisor does not."""
        entry = self._entries[trial_id]
        if entry.stop is None:
            entry.process.note_stop(reason)
        entry.stop = entry.stop or reason
        if immediate:
            entry.process.kill()
            entry.kill_at = None
            return
        entry.process.terminate()
        entry.kill_at = time.monotonic() + self.kill_grace + KILL_BACKSTOP_S

    def apply_deadlines(self) -> None:
        """Stop trials past their time limit; SIGKILL groups past their grace period."""
        now = time.monotonic()
        for trial_id, entry in self.items():
            if entry.stop is None and entry.deadline is not None and now >= entry.deadline:
                log.info("trial %s: time limit reached", trial_id)
                self.stop(trial_id, StopReason.timeout)
            elif entry.kill_at is not None and now >= entry.kill_at:
                log.warning("trial %s: still alive after its grace period; killing it", trial_id)
                entry.process.kill()
                entry.kill_at = None

    def check_heartbeats(self) -> None:
        """A supervisor whose heartbeat went stale is hung: kill it; its trial counts as lost.

        Stale means unchanged for the timeout on this daemon's monotonic clock: a wall clock
        that jumps (NTP, a laptop's suspend) must not make every supervisor look dead.
        """
        now = time.monotonic()
        for trial_id, entry in self.items():
            beat = entry.process.heartbeat()
            if beat != entry.beat:
                entry.beat, entry.beat_seen = beat, now
            elif beat is not None and now - entry.beat_seen > self.heartbeat_timeout:
                log.error(
                    "trial %s: supervisor pid %d silent for %.0f s; killing it",
                    trial_id,
                    entry.process.pid,
                    now - entry.beat_seen,
                )
                entry.process.kill_supervisor()

    def release_all(self) -> None:
        """Stop watching every attempt and leave it to its supervisor (a graceful stop)."""
        for _, entry in self.items():
            self._retire(entry.process)
        self._entries.clear()

    def next_wait(self, now: float) -> float | None:
        """Seconds until the soonest moment a watched trial needs the loop, or None."""
        moments = []
        if any(
            not entry.leader_recorded and now - entry.watched_since < LEADER_POLL_FOR_S
            for entry in self._entries.values()
        ):
            # A trial just launched: record it as running as soon as its command has started.
            moments.append(LEADER_POLL_S)
        for entry in self._entries.values():
            for moment in (entry.deadline if entry.stop is None else None, entry.kill_at):
                if moment is not None:
                    moments.append(max(0.0, moment - now))
        return min(moments, default=None)

    def pgids(self) -> set[int]:
        """The process groups of the watched trials whose command has started."""
        return {pgid for entry in self._entries.values() if (pgid := entry.process.pgid)}

    def subreapers(self) -> dict[int, int]:
        """Each started trial's supervisor (the subreaper of what left its group), mapped to
        the trial's process group."""
        return {
            entry.process.pid: pgid
            for entry in self._entries.values()
            if (pgid := entry.process.pgid) is not None
        }

    def caps_by_group(self) -> dict[int, int]:
        """Each started trial's process group, mapped to its memory slice (capped trials only)."""
        return {
            pgid: entry.memory_limit_mb
            for entry in self._entries.values()
            if entry.memory_limit_mb is not None and (pgid := entry.process.pgid) is not None
        }

    def sync_readers(self) -> None:
        """On the loop: watch the pidfds of the attempts watched now, and no other."""
        if self._loop is None or self._loop.is_closed():
            return
        wanted = {
            fd: entry.process
            for entry in list(self._entries.values())
            if (fd := entry.process.pidfd) is not None
        }
        for fd, process in list(self._readers.items()):
            if wanted.get(fd) is not process:
                self._loop.remove_reader(fd)
                del self._readers[fd]
        self._fired = {fd: p for fd, p in self._fired.items() if wanted.get(fd) is p}
        with self._retired_lock:
            retired, self._retired = self._retired, []
        for process in retired:
            process.close()
        for fd, process in wanted.items():
            if fd in self._readers or fd in self._fired:
                continue
            try:
                self._loop.add_reader(fd, self._exited, fd)
            except OSError:
                # Closed by a stop the tick's thread runs now: the next sync finds it gone.
                continue
            self._readers[fd] = process

    def _exited(self, fd: int) -> None:
        # Level-triggered: watched no more until the tick has collected the attempt.
        process = self._readers.pop(fd, None)
        if self._loop is not None and process is not None:
            self._loop.remove_reader(fd)
            self._fired[fd] = process
        self._on_exit()
