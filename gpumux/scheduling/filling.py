"""Filling free slots: which queued trials start now, where, and in whose fair turn."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

from gpumux.config import Settings
from gpumux.devices.probes import DeviceSnapshot
from gpumux.processes.procfs import group_members
from gpumux.scheduling import fairshare, placement
from gpumux.scheduling.launching import Launcher
from gpumux.scheduling.next_trials import next_trials
from gpumux.scheduling.watched import Watched
from gpumux.schemas import MAX_SPLIT
from gpumux.splits.online import Searches
from gpumux.storage import store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Trial

log = logging.getLogger(__name__)

# A measured per-process overhead above this multiple of the configured one is not believed.
OVERHEAD_BELIEVABLE = 4


class SlotFiller:
    """Places queued trials in free device slots and launches them, one tick at a time."""

    def __init__(
        self,
        *,
        settings: Settings,
        sessions: Sessions,
        searches: Searches,
        launcher: Launcher,
        watched: Watched,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.searches = searches
        self.launcher = launcher
        self.watched = watched
        self.shares = settings.share_weights
        # Per GPU: the most memory a trial was seen to hold beyond its slice (NVML), which
        # replaces the configured overhead in the packing budget once measured.
        self.overhead: dict[str, int] = {}

    def fill(self, devices: Sequence[DeviceSnapshot]) -> None:
        """Fill free device slots with the next trials, each user's fair share first."""
        with self.sessions.read() as session:
            active = store.active_trials(session=session)
            # No device holds more than MAX_SPLIT trials: no more can be placed in one tick.
            queued = next_trials(session=session, limit=MAX_SPLIT * max(1, len(devices)))
            tuned: dict[int, dict[str, int]] = {}
            for trial in queued:
                if trial.sweep_id not in tuned:
                    tuned[trial.sweep_id] = self.searches.tuned_splits(
                        session=session, sweep=trial.sweep, devices=devices
                    )
            pending = [
                placement.PendingTrial(trial_id=t.id, split=t.sweep.split, tuned=tuned[t.sweep_id])
                for t in self.fair_order(queued, active)
            ]
        policy = self.policy()
        for waiting in list(pending):
            # Strict FIFO would wait for it forever, and every trial behind it too.
            reason = placement.never_fits(waiting, devices, policy)
            if reason is not None:
                self.launcher.fail_unstarted(waiting.trial_id, reason)
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
            group_of = group_members(self.watched.pgids())
            self.measure_overhead(devices, group_of)
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
                started = self.launcher.launch(chosen, by_key[chosen.device_key])
            except Exception as error:
                log.exception("trial %s: launch failed", chosen.trial_id)
                self.launcher.fail_unstarted(
                    chosen.trial_id, f"gpumux could not launch it: {error!r}"
                )
                continue
            if started is not None:
                self.watched.add(chosen.trial_id, started)

    def fair_order(self, queued: list[Trial], active: list[Trial]) -> list[Trial]:
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

    def measure_overhead(self, devices: Sequence[DeviceSnapshot], group_of: dict[int, int]) -> None:
        """Learn, per GPU, the most memory one of our trials holds beyond its slice."""
        caps = self.watched.caps_by_group()
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

    def policy(self) -> placement.PackingPolicy:
        """How densely to pack now: the settings, with the overheads measured so far."""
        return placement.PackingPolicy(
            default_split=self.settings.default_split,
            cpu_default_split=self.settings.cpu_split,
            overhead_mb=self.settings.overhead_mb,
            overhead_by_device=dict(self.overhead),
            reserve_mb=self.settings.reserve_mb,
            min_memory_mb=self.settings.min_memory_mb,
        )
