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
from typing import TypeVar

from gpumux.config import Settings
from gpumux.devices.accounting import Overheads
from gpumux.devices.probes import DeviceProbe
from gpumux.devices.snapshot import DeviceSnapshot
from gpumux.fields import MAX_SPLIT
from gpumux.processes.spawner_client import Spawner
from gpumux.scheduling.filling import SlotFiller
from gpumux.scheduling.launching import Launcher
from gpumux.scheduling.lines import LogReports
from gpumux.scheduling.next_trials import next_trials
from gpumux.scheduling.outcomes import StopReason
from gpumux.scheduling.probed import ProbedDevices
from gpumux.scheduling.reaper import Reaper
from gpumux.scheduling.reconcile import reconcile
from gpumux.scheduling.stops import SweepStops
from gpumux.scheduling.watched import Watched
from gpumux.search.studies import Studies
from gpumux.splits.searches import SplitSearches
from gpumux.storage import backlog
from gpumux.storage import trials as trial_store
from gpumux.storage.budget import ReportBudget
from gpumux.storage.engine import Sessions
from gpumux.storage.models import utcnow
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
        self.overheads = Overheads(configured_mb=settings.overhead_mb)
        self.searches = SplitSearches(settings, overheads=self.overheads, here=self.here)
        self.watched = Watched(
            kill_grace=settings.kill_grace, heartbeat_timeout=settings.heartbeat_timeout
        )
        self.probed = ProbedDevices(
            probe=probe, poll_interval=settings.poll_interval, watched=self.watched
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
        self.reaper = Reaper(
            settings=settings,
            sessions=sessions,
            watched=self.watched,
            lines=self.lines,
            searches=self.searches,
            here=self.here,
        )
        self.stops = SweepStops(
            sessions=sessions, watched=self.watched, studies=self.studies, here=self.here
        )
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        # At start, and after a tick failed: trials the database calls active may be unwatched.
        self._reconcile_due = True
        # The one thread the tick's work runs in: ticks stay serialised, the loop stays free.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpumux-tick")

    @property
    def running_count(self) -> int:
        return len(self.watched)

    @property
    def devices(self) -> list[DeviceSnapshot]:
        """This node's devices as last probed."""
        return self.probed.devices

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
        self.reaper.forget()
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
            await self._in_worker(self.probed.snapshot)
        except Exception:
            log.exception("scheduler: the first probe of the devices failed; the ticks retry it")
            self.probed.expire()

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
                self.reaper.forget()
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
            pending = backlog.pending_work(session=session)
        return not self.watched and not self.reaper.ending and pending == 0

    async def tick(self) -> None:
        """One pass, in the tick's thread: read report lines, reap exits, act on cancels,
        pruners and deadlines, then fill free slots."""
        await self._in_worker(self._tick)

    def _tick(self) -> None:
        self.lines.collect()
        self.reaper.reap()
        if self._reconcile_due and not self._draining:
            self.reconcile()
        self.stops.apply_cancels()
        self.stops.apply_pruners()
        self.watched.apply_deadlines()
        self.watched.check_heartbeats()
        if self._draining:
            return
        devices = self.probed.snapshot()
        # Our trials' processes, listed (a scan of /proc) only for what needs them: per-process
        # memory on devices that list it, and memory per trial while a split search measures.
        # A process that left its trial's group still counts as the trial's, found below the
        # trial's supervisor.
        group_of = None
        if self.overheads.measurable(devices):
            group_of = self.probed.ours_since_probe()
        self.filler.fill(devices, group_of=group_of or {})
        # Searches measure their workloads' CUDA contexts, settled ones too, where the devices
        # list their processes.
        measuring = group_of is not None and any(True for _ in self.searches)
        if measuring or any(not search.decision.settled for search in self.searches):
            if group_of is None:
                group_of = self.probed.trial_processes()
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

    def reconcile(self) -> None:
        """Trials the database calls active that this scheduler does not watch (at start, or
        after a write failed): adopt those whose supervisors live on, record those that ended
        with their real exit status, and requeue the rest within their retry budget."""
        with self.sessions.read() as session:
            active = trial_store.active_trials(session=session, node_id=self.node_id)
            unwatched = {(t.id, t.attempt) for t in active if t.id not in self.watched}
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
                    self.reaper.pass_on(session, trial, outcome)
        self._reconcile_due = False

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
        self.reaper.forget()
        self.watched.release_all()

    def _stop_all(self, immediate: bool) -> None:
        for trial_id, _ in self.watched.items():
            self.watched.stop(trial_id, StopReason.shutdown, immediate=immediate)

    def _stopping(self) -> bool:
        """One pass of a stop: record the ends; whether trials remain."""
        self.reaper.reap()
        self.watched.apply_deadlines()
        return bool(self.watched or self.reaper.ending)

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

    def _next_wait(self) -> float:
        if self.lines.behind or self.reaper.ending:
            # A log left unread past its slice, or an end waiting for its last lines: go on.
            return 0.0
        due = self.watched.next_wait(time.monotonic())
        return self.settings.poll_interval if due is None else min(due, self.settings.poll_interval)
