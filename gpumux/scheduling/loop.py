"""The scheduler: the one loop that starts, watches and stops trial processes."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from gpumux import sweepspec
from gpumux.config import Settings
from gpumux.devices.probes import DeviceProbe, NvmlUnavailable
from gpumux.devices.snapshot import DeviceSnapshot
from gpumux.processes.launcher import (
    LaunchError,
    LaunchSpec,
    SupervisedTrial,
    SupervisorOptions,
    TrialEnd,
    group_members,
    kill_leftovers,
    recorded_end,
    recorded_stop,
)
from gpumux.scheduling import fairshare, outcomes, placement
from gpumux.scheduling.outcomes import StopReason
from gpumux.schemas import MAX_SPLIT
from gpumux.server import identity
from gpumux.splits.searches import Searches
from gpumux.status import ACTIVE_TRIAL_STATUSES, TrialStatus
from gpumux.storage import store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Sweep, Trial, utcnow

log = logging.getLogger(__name__)

# A measured per-process overhead above this multiple of the configured one is not believed.
OVERHEAD_BELIEVABLE = 4
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
    ) -> None:
        self.settings = settings
        # Told how long each tick took (the daemon's /metrics histogram).
        self.on_tick = on_tick
        self.sessions = sessions
        self.probe = probe
        self.url = url
        self.devices: list[DeviceSnapshot] = []
        # Per GPU: the most memory a trial was seen to hold beyond its slice (NVML), which
        # replaces the configured overhead in the packing budget once measured.
        self.overhead: dict[str, int] = {}
        self.searches = Searches(settings)
        self.shares = fairshare.parse_shares(settings.shares)
        self._probed_at = float("-inf")
        self._running: dict[int, Running] = {}
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        # At start, and after a tick failed: trials the database calls active may be unwatched.
        self._reconcile_due = True

    @property
    def running_count(self) -> int:
        return len(self._running)

    def wake(self) -> None:
        """Ask for a tick soon; safe to call from any thread."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake.set)

    async def run(self, stop: asyncio.Event) -> None:
        """Tick until `stop` is set, waking on trial exits, new work and deadlines."""
        self._loop = asyncio.get_running_loop()
        while not stop.is_set():
            began = time.perf_counter()
            try:
                await self.tick()
            except Exception:
                # A defect must not take every other trial down with the daemon: log it, go on.
                log.exception("scheduler: a tick failed; carrying on")
                # Its writes may have failed half way (a full disk): look again at what the
                # database calls active but no one watches.
                self._reconcile_due = True
            self.on_tick(time.perf_counter() - began)
            self._wake.clear()
            waits = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
            await asyncio.wait(waits, timeout=self._next_wait(), return_when="FIRST_COMPLETED")
            for waiter in waits:
                waiter.cancel()

    async def run_until_idle(self) -> None:
        """Burst mode: tick until no trial is queued or running (for tests and tools)."""
        self._loop = asyncio.get_running_loop()
        while True:
            await self.tick()
            with self.sessions.read() as session:
                if not self._running and store.pending_work(session=session) == 0:
                    return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self._next_wait())
            except TimeoutError:
                pass

    async def tick(self) -> None:
        """One pass: reap exits, act on cancels and deadlines, then fill free slots."""
        self.reap()
        if self._reconcile_due and not self._draining:
            self.reconcile()
        self.apply_cancels()
        self.apply_deadlines()
        self.check_heartbeats()
        if not self._draining:
            self.place_and_launch()
            if any(not search.decision.settled for search in self.searches):
                with self.sessions.read() as session:
                    changed = self.searches.observe(session=session, now=utcnow())
                if changed:
                    with self.sessions.write.begin() as session:
                        for search in changed:
                            search.save(session=session)

    def reconcile(self) -> None:
        """Trials the database calls active that this scheduler does not watch (at start, or
        after a write failed): adopt those whose supervisors live on, record those that ended
        with their real exit status, and requeue the rest within their retry budget."""
        with self.sessions.read() as session:
            active = {trial.id for trial in store.active_trials(session=session)}
        if active <= self._running.keys():
            self._reconcile_due = False
            return
        with self.sessions.write.begin() as session:
            for trial in store.active_trials(session=session):
                if trial.id in self._running:
                    continue
                run_dir = self.run_dir(trial)
                end = recorded_end(run_dir, trial.attempt)
                if end is not None:
                    log.info("trial %s: ended while the daemon was away", trial.id)
                    self._record(session, trial, end, stop=stop_reason(run_dir))
                    continue
                found = SupervisedTrial.find(
                    trial_id=trial.id, attempt=trial.attempt, run_dir=run_dir
                )
                if found is not None:
                    self._adopt(session, trial, found)
                    continue
                # It may have written its exit and gone between the two looks.
                end = recorded_end(run_dir, trial.attempt)
                if end is not None:
                    self._record(session, trial, end, stop=stop_reason(run_dir))
                    continue
                kill_leftovers(trial.id, run_dir, pgid=trial.pid, started=trial.pid_started)
                outcomes.requeue_or_lose(
                    session=session,
                    trial=trial,
                    why="lost its supervisor while the daemon was away",
                    settings=self.settings,
                )
        self._reconcile_due = False

    def _adopt(self, session: Session, trial: Trial, process: SupervisedTrial) -> None:
        log.info("trial %s: adopted (supervisor pid %d)", trial.id, process.pid)
        deadline = None
        if trial.sweep.time_limit_s and trial.started_at is not None:
            elapsed = (utcnow() - trial.started_at).total_seconds()
            deadline = time.monotonic() + trial.sweep.time_limit_s - elapsed
        stop = stop_reason(process.run_dir)
        self._watch(
            trial.id,
            Running(
                process=process,
                sweep_id=trial.sweep_id,
                memory_limit_mb=trial.memory_limit_mb,
                deadline=deadline,
                stop=stop,
                # Its supervisor was told to stop it: step in if it has not within the grace.
                kill_at=time.monotonic() + self.settings.kill_grace + KILL_BACKSTOP_S
                if stop is not None
                else None,
            ),
        )
        if trial.status is TrialStatus.starting:
            store.set_trial_status(
                session=session,
                trial=trial,
                status=TrialStatus.running,
                started_at=trial.started_at or utcnow(),
            )

    def run_dir(self, trial: Trial) -> Path:
        """Where the supervisor of the trial's current attempt keeps its records."""
        return self.settings.runs_dir / f"{trial.id}.{trial.attempt}"

    def reap(self) -> None:
        """Record the end of every trial whose supervisor has exited, and the leader pid of
        every trial newly started, in one transaction (each commit waits for the disk)."""
        ended: list[tuple[int, Running, TrialEnd | None]] = []
        for trial_id, entry in list(self._running.items()):
            if not entry.process.exited():
                continue
            if self._loop is not None and entry.process.pidfd is not None:
                self._loop.remove_reader(entry.process.pidfd)
            ended.append((trial_id, entry, entry.process.finish()))
            del self._running[trial_id]
        leaders = {
            trial_id: leader
            for trial_id, entry in self._running.items()
            if not entry.leader_recorded and (leader := entry.process.leader) is not None
        }
        if not ended and not leaders:
            return
        # A failed commit (a full disk) leaves these trials active in the database and no
        # longer watched: reconcile() picks them up at the next tick, from their run records.
        with self.sessions.write.begin() as session:
            for trial_id, entry, end in ended:
                self._record_end(session, trial_id, entry, end)
            for trial_id, (pid, started) in leaders.items():
                trial = store.get_trial(session=session, trial_id=trial_id)
                if trial is not None and trial.status in ACTIVE_TRIAL_STATUSES:
                    self._record_running(session, trial)
                    trial.pid, trial.pid_started = pid, started
        for trial_id in leaders:
            self._running[trial_id].leader_recorded = True

    def _record_running(self, session: Session, trial: Trial) -> None:
        if trial.status is TrialStatus.starting:
            store.set_trial_status(session=session, trial=trial, status=TrialStatus.running)

    def _record_end(
        self, session: Session, trial_id: int, entry: Running, end: TrialEnd | None
    ) -> None:
        trial = store.get_trial(session=session, trial_id=trial_id)
        if trial is None:
            return
        if trial.attempt != entry.process.attempt or trial.status not in ACTIVE_TRIAL_STATUSES:
            # Fencing: the end of an older attempt never overwrites a newer one.
            log.warning(
                "trial %s: ignoring the end of attempt %d (now attempt %d, %s)",
                trial_id,
                entry.process.attempt,
                trial.attempt,
                trial.status,
            )
            return
        if end is None:
            outcomes.requeue_or_lose(
                session=session,
                trial=trial,
                why="lost its supervisor (killed, or stopped answering)",
                settings=self.settings,
            )
        else:
            self._record(session, trial, end, stop=entry.stop)

    def _record(
        self,
        session: Session,
        trial: Trial,
        end: TrialEnd,
        *,
        stop: StopReason | None,
    ) -> None:
        if stop is None and trial.sweep.cancel_requested:
            stop = StopReason.cancel
        # Ended before its start was recorded (a short trial, or a write that failed): it did
        # run, so say so first.
        self._record_running(session, trial)
        if end.error is not None and stop is None:
            store.set_trial_status(
                session=session,
                trial=trial,
                status=TrialStatus.failed,
                error=end.error,
                ended_at=utcnow(),
            )
        else:
            outcomes.record_end(
                session=session,
                trial=trial,
                exit_status=end.exit_status,
                stop=stop,
                settings=self.settings,
                searches=self.searches,
            )
        log.info("trial %s: %s -> %s", trial.id, end.exit_status.describe(), trial.status)

    def check_heartbeats(self) -> None:
        """A supervisor whose heartbeat went stale is hung: kill it; its trial counts as lost.

        Stale means unchanged for the timeout on this daemon's monotonic clock: a wall clock
        that jumps (NTP, a laptop's suspend) must not make every supervisor look dead.
        """
        now = time.monotonic()
        for trial_id, entry in self._running.items():
            beat = entry.process.heartbeat()
            if beat != entry.beat:
                entry.beat, entry.beat_seen = beat, now
            elif beat is not None and now - entry.beat_seen > self.settings.heartbeat_timeout:
                log.error(
                    "trial %s: supervisor pid %d silent for %.0f s; killing it",
                    trial_id,
                    entry.process.pid,
                    now - entry.beat_seen,
                )
                entry.process.kill_supervisor()

    def apply_cancels(self) -> None:
        """Drop the queued trials of cancelled sweeps and stop their running ones."""
        with self.sessions.write.begin() as session:
            for sweep in store.sweeps_to_cancel(session=session):
                store.cancel_queued_trials(session=session, sweep=sweep)
        for trial_id in self._trials_of_cancelled_sweeps():
            self.stop_trial(trial_id, StopReason.cancel)

    def _trials_of_cancelled_sweeps(self) -> list[int]:
        sweep_ids = {entry.sweep_id for entry in self._running.values()}
        if not sweep_ids:
            return []
        with self.sessions.read() as session:
            cancelled = {
                sweep_id
                for sweep_id in sweep_ids
                if (sweep := store.get_sweep(session=session, sweep_id=sweep_id))
                and sweep.cancel_requested
            }
        return [
            trial_id
            for trial_id, entry in self._running.items()
            if entry.sweep_id in cancelled and entry.stop is None
        ]

    def apply_deadlines(self) -> None:
        """Stop trials past their time limit; SIGKILL groups past their grace period."""
        now = time.monotonic()
        for trial_id, entry in self._running.items():
            if entry.stop is None and entry.deadline is not None and now >= entry.deadline:
                log.info("trial %s: time limit reached", trial_id)
                self.stop_trial(trial_id, StopReason.timeout)
            elif entry.kill_at is not None and now >= entry.kill_at:
                log.warning("trial %s: still alive after its grace period; killing it", trial_id)
                entry.process.kill()
                entry.kill_at = None

    def stop_trial(self, trial_id: int, reason: StopReason, *, cold: bool = False) -> None:
        """Have the supervisor SIGTERM the trial's group now and SIGKILL it after the grace
        period (at once if cold); the daemon kills it itself if the supervisor does not."""
        entry = self._running[trial_id]
        if entry.stop is None:
            entry.process.note_stop(reason)
        entry.stop = entry.stop or reason
        if cold:
            entry.process.kill()
            entry.kill_at = None
            return
        entry.process.terminate()
        entry.kill_at = time.monotonic() + self.settings.kill_grace + KILL_BACKSTOP_S

    def place_and_launch(self) -> None:
        """Fill free device slots with queued trials, first come first served."""
        devices = self._devices()
        with self.sessions.read() as session:
            active = store.active_trials(session=session)
            queued = store.queued_trials(session=session, limit=self._free_slot_bound(devices))
            tuned: dict[int, dict[str, int]] = {}
            for trial in queued:
                if trial.sweep_id not in tuned:
                    tuned[trial.sweep_id] = self.searches.tuned_splits(
                        session=session, sweep=trial.sweep, devices=devices
                    )
            queued = self._fair_order(queued, active)
            pending = [
                placement.PendingTrial(trial_id=t.id, split=t.sweep.split, tuned=tuned[t.sweep_id])
                for t in queued
            ]
        policy = self._policy()
        for waiting in list(pending):
            # Strict FIFO would wait for it forever, and every trial behind it too.
            reason = placement.never_fits(waiting, devices, policy)
            if reason is not None:
                log.warning("trial %s: %s", waiting.trial_id, reason)
                self._fail_unstarted(waiting.trial_id, reason)
                pending.remove(waiting)
        if not pending:
            return
        running = [
            placement.RunningTrial(
                trial_id=t.id,
                device_key=t.device,
                slot=t.slot or 0,
                memory_limit_mb=t.memory_limit_mb,
            )
            for t in active
            if t.device is not None
        ]
        group_of: dict[int, int] = {}
        if any(device.kind == "gpu" for device in devices):
            group_of = group_members(
                {pgid for entry in self._running.values() if (pgid := entry.process.pgid)}
            )
            self._measure_overhead(devices, group_of)
        plan = placement.place(
            devices=devices,
            running=running,
            pending=pending,
            policy=policy,
            our_pids=group_of.keys(),
        )
        by_key = {device.key: device for device in devices}
        for chosen in plan:
            try:
                self.launch(chosen, by_key[chosen.device_key])
            except Exception as error:
                log.exception("trial %s: launch failed", chosen.trial_id)
                self._fail_unstarted(chosen.trial_id, f"gpumux could not launch it: {error!r}")

    def _fair_order(self, queued: list[Trial], active: list[Trial]) -> list[Trial]:
        """Queued trials in the order free slots go to them: each user's fair share first."""
        running = Counter(trial.sweep.owner.name for trial in active)
        by_id = {trial.id: trial for trial in queued}
        order = fairshare.fair_order(
            (
                fairshare.Candidate(
                    trial_id=trial.id,
                    owner=trial.sweep.owner.name,
                    sweep_id=trial.sweep_id,
                    priority=trial.sweep.priority,
                )
                for trial in queued
            ),
            running=running,
            shares=self.shares,
            max_running=self.settings.max_running_per_user,
        )
        return [by_id[candidate.trial_id] for candidate in order]

    def launch(self, chosen: placement.Placement, device: DeviceSnapshot) -> None:
        """Start one placed trial: claim its slot, spawn it, record its pid."""
        token = secrets.token_urlsafe(32)
        with self.sessions.read() as session:
            trial = store.get_trial(session=session, trial_id=chosen.trial_id)
            if trial is None:
                return
            try:
                user, user_env = run_as(trial.sweep)
            except LaunchError as error:
                log.warning("trial %s: %s", chosen.trial_id, error)
                self._fail_unstarted(chosen.trial_id, str(error))
                return
        with self.sessions.write.begin() as session:
            trial = store.get_trial(session=session, trial_id=chosen.trial_id)
            if trial is None or trial.status is not TrialStatus.queued:
                return
            log_path = (
                self.settings.logs_dir
                / f"sweep-{trial.sweep_id}"
                / (f"trial-{trial.id}.{trial.attempt}.log")
            )
            store.set_trial_status(
                session=session,
                trial=trial,
                status=TrialStatus.starting,
                device=chosen.device_key,
                slot=chosen.slot,
                split=chosen.split,
                memory_limit_mb=chosen.memory_limit_mb,
                cpu_threads=chosen.cpu_threads,
                token_hash=store.token_hash(token),
                log_path=str(log_path),
                exit_code=None,
                signal=None,
                pid=None,
                pid_started=None,
                started_at=utcnow(),
            )
            sweep = trial.sweep
            spec = LaunchSpec(
                trial_id=trial.id,
                sweep_id=sweep.id,
                attempt=trial.attempt,
                argv=sweepspec.render_command(sweep.command, trial.params),
                workdir=sweep.workdir,
                base_env={**sweep.env, **user_env},
                params=trial.params,
                url=self.url,
                token=token,
                log_path=log_path,
                device_kind=device.kind,
                visible_device=visible_device(device),
                device_memory_mb=device.memory_total_mb,
                split=chosen.split,
                memory_limit_mb=chosen.memory_limit_mb,
                cpu_threads=chosen.cpu_threads,
            )
            time_limit = sweep.time_limit_s
            run_dir = self.run_dir(trial)
        try:
            process = SupervisedTrial.spawn(
                spec, run_dir=run_dir, options=self._supervision(), user=user
            )
        except LaunchError as error:
            log.warning("trial %s: %s", chosen.trial_id, error)
            self._fail_unstarted(chosen.trial_id, str(error))
            return
        deadline = time.monotonic() + time_limit if time_limit else None
        self._watch(
            chosen.trial_id,
            Running(
                process=process,
                sweep_id=spec.sweep_id,
                memory_limit_mb=chosen.memory_limit_mb,
                deadline=deadline,
            ),
        )
        # It counts as running once its supervisor has started the command (reap() records
        # that with the leader's pid, soon: see _next_wait).

    def _watch(self, trial_id: int, entry: Running) -> None:
        self._running[trial_id] = entry
        if entry.process.pidfd is not None and self._loop is not None:
            self._loop.add_reader(entry.process.pidfd, self._on_exit, entry.process)

    def _supervision(self) -> SupervisorOptions:
        return SupervisorOptions(
            kill_grace=self.settings.kill_grace,
            heartbeat_interval=self.settings.heartbeat_interval,
            log_max_bytes=int(self.settings.log_max_mb * 1024 * 1024),
            log_keep=self.settings.log_keep,
        )

    def _fail_unstarted(self, trial_id: int, error: str) -> None:
        with self.sessions.write.begin() as session:
            trial = store.get_trial(session=session, trial_id=trial_id)
            if trial is not None and trial.status in (TrialStatus.queued, TrialStatus.starting):
                if trial.status is TrialStatus.queued:
                    store.set_trial_status(
                        session=session, trial=trial, status=TrialStatus.starting
                    )
                store.set_trial_status(
                    session=session,
                    trial=trial,
                    status=TrialStatus.failed,
                    error=error,
                    ended_at=utcnow(),
                )

    def _on_exit(self, process: SupervisedTrial) -> None:
        if self._loop is not None and process.pidfd is not None:
            self._loop.remove_reader(process.pidfd)
        self._wake.set()

    async def drain(self, *, stop_trials: bool, cold: bool = False) -> None:
        """Warm stop: launch nothing more. Trials run on under their supervisors for the next
        daemon to adopt, or with `stop_trials` are stopped (SIGTERM, SIGKILL later) and requeued."""
        self._draining = True
        if not stop_trials:
            for entry in self._running.values():
                if self._loop is not None and entry.process.pidfd is not None:
                    self._loop.remove_reader(entry.process.pidfd)
                entry.process.close()
            log.info("scheduler: leaving %d trials to their supervisors", len(self._running))
            self._running.clear()
            return
        for trial_id in list(self._running):
            self.stop_trial(trial_id, StopReason.shutdown, cold=cold)
        while self._running:
            self._wake.clear()
            self.reap()
            self.apply_deadlines()
            if self._running:
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=self._next_wait())
                except TimeoutError:
                    pass

    def force(self) -> None:
        """Cold stop: SIGKILL every trial group now."""
        for trial_id in list(self._running):
            self.stop_trial(trial_id, StopReason.shutdown, cold=True)
        self._wake.set()

    def _devices(self) -> list[DeviceSnapshot]:
        now = time.monotonic()
        if now - self._probed_at >= self.settings.poll_interval:
            self._probed_at = now
            try:
                self.devices = self.probe.snapshot()
            except NvmlUnavailable as error:
                # Keep the last snapshot: trials on it run on; nothing new is placed blindly.
                log.error("devices: NVML failed (%s); placing nothing until it answers", error)
                self.devices = [replace(d, error=str(error)) for d in self.devices]
        return self.devices

    def _measure_overhead(self, devices: list[DeviceSnapshot], group_of: dict[int, int]) -> None:
        caps = {
            pgid: entry.memory_limit_mb
            for entry in self._running.values()
            if entry.memory_limit_mb is not None and (pgid := entry.process.pgid) is not None
        }
        for device in devices:
            measured = placement.measured_overhead_mb(device, group_of, caps)
            if measured is not None and measured > OVERHEAD_BELIEVABLE * self.settings.overhead_mb:
                # Far beyond any CUDA context: that trial's cap did not apply (TensorFlow started
                # before the hook, or a framework gpumux does not cap). Not a per-process cost.
                log.warning(
                    "device %s: a trial holds %d MB beyond its slice; its cap did not apply",
                    device.key,
                    measured,
                )
                continue
            if measured is not None and measured > self.overhead.get(device.key, 0):
                log.info("device %s: a trial holds %d MB beyond its slice", device.key, measured)
                self.overhead[device.key] = measured

    def _policy(self) -> placement.PackingPolicy:
        return placement.PackingPolicy(
            default_split=self.settings.default_split,
            cpu_default_split=self.settings.cpu_split,
            overhead_mb=self.settings.overhead_mb,
            overhead_by_device=dict(self.overhead),
            reserve_mb=self.settings.reserve_mb,
            min_memory_mb=self.settings.min_memory_mb,
        )

    def _free_slot_bound(self, devices: list[DeviceSnapshot]) -> int:
        # No device holds more than MAX_SPLIT trials: no more can be placed in one tick.
        return MAX_SPLIT * max(1, len(devices))

    def _next_wait(self) -> float:
        now = time.monotonic()
        moments = [self.settings.poll_interval]
        if any(
            not entry.leader_recorded and now - entry.watched_since < LEADER_POLL_FOR_S
            for entry in self._running.values()
        ):
            # A trial just launched: record it as running as soon as its command has started.
            moments.append(LEADER_POLL_S)
        for entry in self._running.values():
            for moment in (entry.deadline if entry.stop is None else None, entry.kill_at):
                if moment is not None:
                    moments.append(max(0.0, moment - now))
        return min(moments)


def stop_reason(run_dir: Path) -> StopReason | None:
    """Why a previous daemon stopped this trial, as its run directory says."""
    reason = recorded_stop(run_dir)
    return StopReason(reason) if reason in set(StopReason) else None


def run_as(sweep: Sweep) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """Whom a trial of this sweep runs as: when the daemon is root, the sweep's owner (their
    uid, gid and groups, their HOME), never root's; otherwise the daemon's own user."""
    if os.geteuid() != 0:
        return None, {}
    try:
        account = identity.UserAccount.from_name(sweep.owner.name)
    except identity.UnknownUser as error:
        raise LaunchError(f"cannot run as {sweep.owner.name}: {error}") from error
    if account.uid == 0:
        return None, {}
    reason = identity.readable_directory(sweep.workdir, account)
    if reason is not None:
        raise LaunchError(f"{account.name} cannot use the working directory: {reason}")
    user = {"uid": account.uid, "gid": account.gid, "groups": list(account.groups)}
    env = {"HOME": str(account.home), "USER": account.name, "LOGNAME": account.name}
    return user, env


def visible_device(device: DeviceSnapshot) -> str:
    """CUDA_VISIBLE_DEVICES for a trial on this device: the GPU's UUID, its index without one."""
    if device.kind == "cpu":
        return ""
    return device.uuid or str(device.index)
