"""The scheduler: the one loop that starts, watches and stops trial processes.

Each tick, in this order: record the ends of trials whose supervisors exited (and the pids of
those that started); reconcile, when due, what the database calls active with what is watched;
act on cancels, pruners, time limits and stale heartbeats; fill free slots; let the split
search see its devices. The daemon's API writes only intent (a sweep, a cancel); this loop alone
moves trials through their lifecycle.

The tick's work (logs read, reports parsed, the database written) runs in one worker thread of
its own, one call at a time, so that the event loop it shares with the API and the node's
heartbeat never waits on a trial; only the supervisors' pidfds stay on the loop (`Watched`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TypeVar

from sqlalchemy.orm import Session

from gpumux.config import Settings
from gpumux.devices.accounting import Overheads
from gpumux.devices.probes import DeviceProbe, NvmlUnavailable
from gpumux.devices.snapshot import DeviceSnapshot
from gpumux.fields import MAX_SPLIT
from gpumux.processes.procfs import group_members
from gpumux.processes.rundir import TrialEnd
from gpumux.processes.spawner_client import Spawner
from gpumux.scheduling import outcomes
from gpumux.scheduling.filling import SlotFiller
from gpumux.scheduling.launching import Launcher
from gpumux.scheduling.lines import LogReports
from gpumux.scheduling.next_trials import next_trials
from gpumux.scheduling.outcomes import Outcome, StopReason
from gpumux.scheduling.reconcile import reconcile, stop_reason
from gpumux.scheduling.watched import Running, Watched
from gpumux.search.studies import Studies
from gpumux.splits.searches import SplitSearches
from gpumux.storage import backlog, lifecycle
from gpumux.storage import sweeps as sweep_store
from gpumux.storage import trials as trial_store
from gpumux.storage.budget import ReportBudget
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Trial, utcnow
from gpumux.storage.nodes import NodeIdentity, ThisNode

log = logging.getLogger(__name__)

T = TypeVar("T")


class Scheduler:
    """Fills device slots from the queue; the only writer of trial lifecycle state."""

    def __init__(
        self,
        *,
        settings: Settings,
        sessions: Sessions,
        probe: DeviceProbe,
        url: str,
        on_tick: Callable[[float], None] = lambda seconds: None,
        spawner: Spawner | None = None,
        node: NodeIdentity | None = None,
        budget: ReportBudget | None = None,
    ) -> None:
        self.settings = settings
        # The node this scheduler runs trials for: it claims, watches and records only its
        # own. None: the database's only scheduler (a tool, a test), which owns every trial.
        # Its collaborators share this one object: a rejoin changes it for all of them.
        self.here = ThisNode(node)
        # Told how long each tick took (the daemon's /metrics histogram).
        self.on_tick = on_tick
        self.sessions = sessions
        # Whether the last tick found the database's server unreachable.
        self._database_lost = False
        self.probe = probe
        self.devices: list[DeviceSnapshot] = []
        self.overheads = Overheads(configured_mb=settings.overhead_mb)
        self.searches = SplitSearches(settings, overheads=self.overheads, here=self.here)
        self.watched = Watched(
            kill_grace=settings.kill_grace, heartbeat_timeout=settings.heartbeat_timeout
        )
        self.studies = Studies()
        # Shared with the API's report route (default: the settings' own).
        self.budget = budget or ReportBudget.of(settings)
        self.lines = LogReports(sessions=sessions, budget=self.budget, here=self.here)
        self.launcher = Launcher(
            settings=settings, sessions=sessions, url=url, spawner=spawner, here=self.here
        )
        self.filler = SlotFiller(
            settings=settings,
            sessions=sessions,
            searches=self.searches,
            studies=self.studies,
            launcher=self.launcher,
            watched=self.watched,
            overheads=self.overheads,
            here=self.here,
        )
        self._probed_at = float("-inf")
        # Our trials' processes seen since the devices were last probed: one that ended since
        # is still listed in that snapshot, and counted as another's it would shrink the next
        # trial's slice by its memory (a slice at the edge then runs out of memory).
        self._ours_since_probe: dict[int, int] = {}
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        # At start, and after a tick failed: trials the database calls active may be unwatched.
        self._reconcile_due = True
        # Attempts whose supervisors exited, recorded once their logs are read to the end.
        self._ending: dict[int, tuple[Running, TrialEnd | None]] = {}
        # The one thread the tick's work runs in: ticks stay serialised, the loop stays free.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpumux-tick")

    @property
    def running_count(self) -> int:
        return len(self.watched)

    @property
    def node(self) -> NodeIdentity | None:
        """This scheduler's node incarnation, None when it owns every trial."""
        return self.here.identity

    @property
    def node_id(self) -> int | None:
        """The id of this scheduler's node, None when it owns every trial."""
        return self.here.id

    async def use_node(self, node: NodeIdentity) -> None:
        """Run trials for this node incarnation from now on (after a rejoin)."""
        await self._in_worker(self._use_node, node)

    def _use_node(self, node: NodeIdentity) -> None:
        self.here.identity = node
        self.wake()

    async def abandon(self) -> None:
        """This node's lease was lost and its trials requeued for other nodes: kill every
        trial group now and stop watching them, recording nothing (they are no longer ours)."""
        await self._in_worker(self._abandon)

    def _abandon(self) -> None:
        self._ending.clear()
        for trial_id, entry in self.watched.items():
            log.warning(
                "trial %s: killing attempt %d, requeued elsewhere", trial_id, entry.process.attempt
            )
            entry.process.kill()
        self.watched.release_all()
        self.lines.forget()

    def wake(self) -> None:
        """Ask for a tick soon; safe to call from any thread."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake.set)

    def _attach(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.watched.attach(self._loop, self._wake.set)

    async def _in_worker(self, work: Callable[..., T], *args: object) -> T:
        """Run `work` in the tick's thread, then watch the pidfds of what it launched or
        collected from the loop."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker, work, *args)
        finally:
            self.watched.sync_readers()

    async def probe_first(self) -> None:
        """Probe the devices once before the API answers, so that a client asking right after
        the daemon started (`gpumux tune` does) finds them listed. A failure is the first tick's
        to meet and log."""
        try:
            await self._in_worker(self._devices)
        except Exception:
            log.exception("scheduler: the first probe of the devices failed; the ticks retry it")
            self._probed_at = float("-inf")

    def close(self) -> None:
        """Let the tick's thread go (after the last tick)."""
        self._worker.shutdown(wait=True)

    async def run(self, stop: asyncio.Event) -> None:
        """Tick until `stop` is set, waking on trial exits, new work and deadlines."""
        self._attach()
        while not stop.is_set():
            began = time.perf_counter()
            # Cleared before the tick, not after: a wake while it runs in its thread (an exit,
            # new work) brings the next tick at once.
            self._wake.clear()
            try:
                await self.tick()
                if self._database_lost:
                    self._database_lost = False
                    log.warning("scheduler: the database is reachable again")
            except Exception as error:
                if self.sessions.dialect.is_unreachable(error):
                    # The server is down or out of reach: the trials run on under their
                    # supervisors, and each tick retries until it is back. Said once.
                    if not self._database_lost:
                        log.warning(
                            "scheduler: the database %s is unreachable (%s); retrying every "
                            "tick, the trials run on",
                            self.sessions.dialect.label,
                            (str(getattr(error, "orig", error)).splitlines() or ["no reason"])[0],
                        )
                    self._database_lost = True
                else:
                    # A defect must not take every other trial down with the daemon: log it.
                    log.exception("scheduler: a tick failed; carrying on")
                # Its writes may have failed half way (a full disk): look again at what the
                # database calls active but no one watches, and rebuild the studies and the
                # report-line readers from what it kept.
                self._reconcile_due = True
                self.studies.forget(self.studies)
                self.lines.forget()
                # Ends waiting for their last lines are recorded by the reconcile instead.
                self._ending.clear()
            self.on_tick(time.perf_counter() - began)
            waits = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
            await asyncio.wait(waits, timeout=self._next_wait(), return_when="FIRST_COMPLETED")
            for waiter in waits:
                waiter.cancel()

    async def run_until_idle(self) -> None:
        """Burst mode: tick until no trial is queued or running (for tests and tools)."""
        self._attach()
        while True:
            self._wake.clear()
            await self.tick()
            if await self._in_worker(self._idle):
                return
            await self._sleep()

    def _idle(self) -> bool:
        with self.sessions.read() as session:
            return (
                not self.watched and not self._ending and backlog.pending_work(session=session) == 0
            )

    async def tick(self) -> None:
        """One pass, in the tick's thread: read report lines, reap exits, act on cancels,
        pruners and deadlines, then fill free slots."""
        await self._in_worker(self._tick)

    def _tick(self) -> None:
        self.lines.collect()
        self.reap()
        if self._reconcile_due and not self._draining:
            self.reconcile()
        self.apply_cancels()
        self.apply_pruners()
        self.watched.apply_deadlines()
        self.watched.check_heartbeats()
        if self._draining:
            return
        devices = self._devices()
        # Our trials' processes, listed (a scan of /proc) only for what needs them: per-process
        # memory on devices that list it, and memory per trial while a split search measures.
        # A process that left its trial's group still counts as the trial's, found below the
        # trial's supervisor.
        group_of = None
        if self.overheads.measurable(devices):
            group_of = self._trial_processes()
            self._ours_since_probe.update(group_of)
            group_of = dict(self._ours_since_probe)
        self.filler.fill(devices, group_of=group_of or {})
        if any(not search.decision.settled for search in self.searches):
            if group_of is None:
                group_of = self._trial_processes()
            with self.sessions.read() as session:
                changed = self.searches.observe(
                    session=session,
                    now=utcnow(),
                    waiting=[t.sweep for t in next_trials(session=session, limit=MAX_SPLIT)],
                    devices=devices,
                    group_of=group_of,
                )
            if changed:
                with self.sessions.write.begin() as session:
                    for search in changed:
                        search.save(session=session)

    def _trial_processes(self) -> dict[int, int]:
        """Our trials' processes, each mapped to its trial's process group: every process a scan
        of /proc finds in a watched group or below its supervisor, and each group's leader even
        where it exited between the probe and the scan (the snapshot still lists it, and counted
        as another's its memory would shrink the next trial's slice)."""
        pgids = self.watched.pgids()
        leaders = {pgid: pgid for pgid in pgids}
        return leaders | group_members(pgids, subreapers=self.watched.subreapers())

    def reconcile(self) -> None:
        """Trials the database calls active that this scheduler does not watch (at start, or
        after a write failed): adopt those whose supervisors live on, record those that ended
        with their real exit status, and requeue the rest within their retry budget."""
        with self.sessions.read() as session:
            active = {
                t.id for t in trial_store.active_trials(session=session, node_id=self.node_id)
            }
        unwatched = {trial_id for trial_id in active if trial_id not in self.watched}
        if unwatched:
            # Trials that ended while no daemon ran: what they printed last is read first, a
            # slice and a short transaction at a time.
            self.lines.drain(unwatched)
            with self.sessions.write.begin() as session:
                recorded = reconcile(
                    session=session,
                    watched=self.watched,
                    settings=self.settings,
                    node_id=self.node_id,
                )
                for trial, outcome in recorded:
                    self._pass_on(session, trial, outcome)
        self._reconcile_due = False

    def reap(self) -> None:
        """Record the end of every trial whose supervisor has exited and whose log is read to
        its end, and the leader pid of every trial newly started, in one transaction (each
        commit waits for the disk)."""
        for trial_id, entry, end in self.watched.collect_exited():
            self._ending[trial_id] = (entry, end)
        ended = []
        if self._ending:
            # Their supervisors have exited, so their logs are whole: their last lines are read
            # first, a slice a tick (a flood's end takes several ticks, each short).
            self.lines.ended(self._ending)
            for trial_id in self.lines.collect(only=self._ending):
                entry, end = self._ending.pop(trial_id)
                ended.append((trial_id, entry, end))
        leaders = self.watched.new_leaders()
        if not ended and not leaders:
            return
        # A failed commit (a full disk) leaves these trials active in the database and no
        # longer watched: reconcile() picks them up at the next tick, from their run records.
        with self.sessions.write.begin() as session:
            for trial_id, entry, end in ended:
                self._record_end(session, trial_id, entry, end)
            for trial_id, (pid, started) in leaders.items():
                trial = trial_store.get_trial(session=session, trial_id=trial_id)
                attempt = self.watched[trial_id].process.attempt
                if trial is not None and self._holds(trial, attempt, "its start"):
                    lifecycle.record_started(
                        session=session, trial=trial, pid=pid, pid_started=started
                    )
        for trial_id in leaders:
            self.watched[trial_id].leader_recorded = True

    def _record_end(
        self, session: Session, trial_id: int, entry: Running, end: TrialEnd | None
    ) -> None:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        if trial is None:
            return
        if not self._holds(trial, entry.process.attempt, "the end"):
            return
        if end is None:
            outcomes.requeue_or_lose(
                session=session,
                trial=trial,
                why="lost its supervisor (killed, or stopped answering)",
                settings=self.settings,
            )
            return
        # The supervisor's own stop (its node's lease lapsed) when this daemon gave none.
        stop = entry.stop or stop_reason(entry.process.run_dir)
        outcome = outcomes.record(
            session=session, trial=trial, end=end, stop=stop, settings=self.settings
        )
        self._pass_on(session, trial, outcome)

    def _holds(self, trial: Trial, attempt: int, what: str) -> bool:
        """Whether this node may still record `what` of the trial's `attempt`. Fencing: an
        older attempt's news never overwrites a newer one, nor one another node runs."""
        refused = trial_store.still_held(trial, node_id=self.node_id, attempt=attempt)
        if refused is not None:
            log.warning(
                "trial %s: refusing %s of attempt %d (%s)", trial.id, what, attempt, refused
            )
        return refused is None

    def _pass_on(self, session: Session, trial: Trial, outcome: Outcome) -> None:
        """Hand what a trial's end teaches to the split search."""
        if outcome.out_of_memory:
            self.searches.out_of_memory(session=session, trial=trial)

    def apply_cancels(self) -> None:
        """Drop the queued trials of cancelled sweeps and stop their running ones."""
        with self.sessions.write.begin() as session:
            for sweep in sweep_store.sweeps_to_cancel(session=session):
                lifecycle.cancel_queued_trials(session=session, sweep=sweep)
        for trial_id in self._trials_of_cancelled_sweeps():
            self.watched.stop(trial_id, StopReason.cancel)

    def apply_pruners(self) -> None:
        """Let each pruned sweep's pruner look at the steps its running trials reported, and
        stop those it prunes, like a cancel; their slots go to the next trials once they exit."""
        with self.sessions.read() as session:
            open_sweeps = sweep_store.open_sweeps(session=session)
        self.studies.forget(set(self.studies) - {sweep.id for sweep in open_sweeps})
        if not any(sweep.prune for sweep in open_sweeps):
            return
        with self.sessions.write.begin() as session:
            pruned = [s for s in sweep_store.open_sweeps(session=session) if s.prune is not None]
            stopping = self.studies.to_prune(session=session, sweeps=pruned)
        stopped = []
        for decision in stopping:
            entry = self.watched[decision.trial_id] if decision.trial_id in self.watched else None
            if entry is not None and entry.stop is None:
                self.watched.stop(decision.trial_id, StopReason.prune)
                stopped.append(decision)
        if stopped:
            # Said now, for the trial's end to carry: it reports on until the signal lands.
            with self.sessions.write.begin() as session:
                for decision in stopped:
                    trial = trial_store.get_trial(session=session, trial_id=decision.trial_id)
                    attempt = self.watched[decision.trial_id].process.attempt
                    if trial is not None and self._holds(trial, attempt, "the pruning"):
                        lifecycle.note_pruned(session=session, trial=trial, note=decision.note)

    def _trials_of_cancelled_sweeps(self) -> list[int]:
        running = list(self.watched.items())
        sweep_ids = {entry.sweep_id for _, entry in running}
        if not sweep_ids:
            return []
        with self.sessions.read() as session:
            cancelled = {
                sweep_id
                for sweep_id in sweep_ids
                if (sweep := sweep_store.get_sweep(session=session, sweep_id=sweep_id))
                and sweep.cancel_requested
            }
        return [
            trial_id
            for trial_id, entry in running
            if entry.sweep_id in cancelled and entry.stop is None
        ]

    async def drain(self, *, stop_trials: bool) -> None:
        """Graceful stop: launch nothing more. Trials run on under their supervisors for the next
        daemon to adopt, or with `stop_trials` are stopped (SIGTERM, SIGKILL later) and requeued."""
        self._draining = True
        if not stop_trials:
            log.info("scheduler: leaving %d trials to their supervisors", len(self.watched))
            await self._in_worker(self._release)
            return
        await self._in_worker(self._stop_all, False)
        while True:
            self._wake.clear()
            if not await self._in_worker(self._stopping):
                break
            await self._sleep()

    def _release(self) -> None:
        # Ends not recorded yet are recorded by the next daemon, from their run directories.
        self._ending.clear()
        self.watched.release_all()

    def _stop_all(self, immediate: bool) -> None:
        for trial_id, _ in self.watched.items():
            self.watched.stop(trial_id, StopReason.shutdown, immediate=immediate)

    def _stopping(self) -> bool:
        """One pass of a stop: record the ends; whether trials remain."""
        self.reap()
        self.watched.apply_deadlines()
        return bool(self.watched or self._ending)

    async def force(self) -> None:
        """Immediate stop: SIGKILL every trial group now (as soon as the tick's thread is free: its
        work is a slice at a time)."""
        await self._in_worker(self._stop_all, True)
        self._wake.set()

    async def _sleep(self) -> None:
        """Until woken (an exit, new work) or the next moment something is due."""
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=self._next_wait())
        except TimeoutError:
            pass

    def _devices(self) -> list[DeviceSnapshot]:
        now = time.monotonic()
        if now - self._probed_at >= self.settings.poll_interval:
            self._probed_at = now
            self._ours_since_probe = {}
            try:
                self.devices = self.probe.snapshot()
            except NvmlUnavailable as error:
                # Keep the last snapshot: trials on it run on; nothing new is placed blindly.
                log.error("devices: NVML failed (%s); placing nothing until it answers", error)
                self.devices = [replace(d, error=str(error)) for d in self.devices]
        return self.devices

    def _next_wait(self) -> float:
        if self.lines.behind or self._ending:
            # A log left unread past its slice, or an end waiting for its last lines: go on.
            return 0.0
        due = self.watched.next_wait(time.monotonic())
        return self.settings.poll_interval if due is None else min(due, self.settings.poll_interval)
