"""Filling free slots: which queued trials start now, where, and in whose fair turn."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from sqlalchemy.orm import Session

from gpumux.config import Settings
from gpumux.devices.accounting import Overheads
from gpumux.devices.kinds import KINDS
from gpumux.devices.snapshot import DeviceSnapshot, DeviceSummary
from gpumux.fields import MAX_SPLIT
from gpumux.scheduling import fairshare, placement
from gpumux.scheduling.launching import Launcher
from gpumux.scheduling.next_trials import NextTrial, next_trials
from gpumux.scheduling.watched import Watched
from gpumux.search.studies import SamplerFailed, Studies
from gpumux.splits.searches import SplitSearches, trial_memory
from gpumux.storage import lifecycle, nodes
from gpumux.storage import sweeps as sweep_store
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Sweep, Trial
from gpumux.storage.nodes import ThisNode

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OtherNode:
    """Another active node: its name, and its devices as its last heartbeat wrote them."""

    name: str
    devices: list[Any]


@dataclass(frozen=True)
class Elsewhere:
    """Whether a trial that fits no device here fits another node's (None: cannot tell), and
    why: where it fits, what cannot be judged, or why it fits none of theirs either."""

    fits: bool | None
    why: str


class SlotFiller:
    """Places queued trials in free device slots and launches them, one tick at a time."""

    def __init__(
        self,
        *,
        settings: Settings,
        sessions: Sessions,
        searches: SplitSearches,
        studies: Studies,
        launcher: Launcher,
        watched: Watched,
        overheads: Overheads,
        here: ThisNode | None = None,
    ) -> None:
        self.settings = settings
        # Placement counts this node's trials on its devices; fair share counts every node's.
        self.here = here or ThisNode()
        self.sessions = sessions
        self.searches = searches
        self.studies = studies
        self.launcher = launcher
        self.watched = watched
        self.shares = settings.share_weights
        # What a trial holds beyond its cap, per device: measured here, read by the search too.
        self.overheads = overheads
        # The sweeps whose next trial reserved a device at the last fill, in that order: it
        # keeps its turn, or a trial fair share puts first at the next fill would take the
        # share it waits for, again and again.
        self.heads: list[int] = []
        # The sweeps whose trials fit no device here but stay queued for another node, and
        # have been logged as such.
        self.told: set[int] = set()

    def fill(self, devices: Sequence[DeviceSnapshot], *, group_of: Mapping[int, int]) -> None:
        """Fill free device slots with the next trials, each user's fair share first;
        `group_of` maps our trials' pids to their process groups where devices list processes."""
        with self.sessions.read() as session:
            everywhere = trial_store.active_trials(session=session)
            active = [
                t for t in everywhere if self.here.id is None or t.node_id in (self.here.id, None)
            ]
            # No device holds more than MAX_SPLIT trials: no more can be placed in one tick.
            queued = next_trials(session=session, limit=MAX_SPLIT * max(1, len(devices)))
            tuned: dict[int, dict[str, int]] = {}
            for trial in queued:
                if trial.sweep_id not in tuned:
                    tuned[trial.sweep_id] = self.searches.searched_splits(
                        session=session, sweep=trial.sweep, devices=devices
                    )
            pending = [
                placement.PendingTrial(
                    trial_id=t.id, split=t.sweep.split, tuned=tuned[t.sweep_id], sweep_id=t.sweep_id
                )
                for t in queued
            ]
            # Only a sweep with a trial waiting can use a credit: its N is in `tuned` already.
            grown = credits(active, tuned)
            raised = {t.id: n for t in active if (n := grown_split(t, tuned)) is not None}
            peaks = {
                (t.device, t.sweep_id): self.searches.peak_mb(sweep=t.sweep, device_key=t.device)
                for t in active
                if t.id in raised and t.device is not None
            }
            policy = self.policy(
                session, [*(t.sweep for t in queued), *(t.sweep for t in active)], devices
            )
            pending = self.fair_order(queued, everywhere, pending, devices, policy)
        sweep_of = {trial.id: trial.sweep_id for trial in queued}
        pending = self.set_aside(pending, devices, policy, sweep_of)
        if not pending:
            self.heads = []
            return
        running = running_trials(
            active, raised=raised, devices=devices, group_of=group_of, peaks=peaks
        )
        if self.overheads.measurable(devices):
            self.overheads.observe(devices, group_of=group_of, caps=self.watched.caps_by_group())
        plan = placement.plan(
            devices=devices,
            running=running,
            pending=heads_first(pending, self.heads, sweep_of),
            policy=policy,
            our_pids=group_of.keys(),
            credits=grown,
        )
        self.heads = kept_turns(plan, pending, sweep_of, devices, policy)
        by_key = {device.key: device for device in devices}
        for planned in plan.placements:
            trial_id = self.asked(planned.trial_id, sweep_of[planned.trial_id])
            if trial_id is None:
                continue
            chosen = replace(planned, trial_id=trial_id)
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

    def set_aside(
        self,
        pending: list[placement.PendingTrial],
        devices: Sequence[DeviceSnapshot],
        policy: placement.PackingPolicy,
        sweep_of: Mapping[int, int],
    ) -> list[placement.PendingTrial]:
        """The pending trials that fit a device here. One whose fixed split fits none would
        reserve a device forever, holding back every trial behind it there: it is failed,
        unless another active node's devices may fit it (then it stays queued for that node)."""
        # Told once per sweep while it waits, not at every tick.
        self.told &= set(sweep_of.values())
        others: list[OtherNode] | None = None
        kept = []
        for waiting in pending:
            reason = placement.never_fits(waiting, devices, policy)
            if reason is None:
                kept.append(waiting)
                continue
            if others is None:
                others = self.other_nodes()
            verdict = elsewhere(waiting, others, policy)
            sweep_id = sweep_of[waiting.trial_id]
            if verdict.fits is not False:
                if sweep_id not in self.told:
                    self.told.add(sweep_id)
                    log.log(
                        logging.INFO if verdict.fits else logging.WARNING,
                        "sweep %s: %s; its trials stay queued for the other nodes: %s",
                        sweep_id,
                        reason,
                        verdict.why,
                    )
                continue
            reason = "; ".join(part for part in (reason, verdict.why) if part)
            log.warning("trial %s: %s", waiting.trial_id, reason)
            trial_id = self.asked(waiting.trial_id, sweep_id)
            if trial_id is not None:
                self.launcher.fail_unstarted(trial_id, reason)
        return kept

    def other_nodes(self) -> list[OtherNode]:
        """The other active nodes and their devices, none when this scheduler owns every trial."""
        if self.here.id is None:
            return []
        with self.sessions.read() as session:
            return [
                OtherNode(name=node.name, devices=list(node.devices))
                for node in nodes.active_nodes(session=session)
                if node.id != self.here.id
            ]

    def asked(self, trial_id: int, sweep_id: int) -> int | None:
        """The stored trial behind a next trial: itself, or for a trial not asked yet the one
        its sweep's sampler chooses now (None once the budget is spent or the sampler failed)."""
        if trial_id >= 0:
            return trial_id
        with self.sessions.write.begin() as session:
            sweep = sweep_store.get_sweep(session=session, sweep_id=sweep_id)
            if sweep is None or sweep.cancel_requested:
                return None
            try:
                trial = self.studies.ask(session=session, sweep=sweep)
            except SamplerFailed:
                # Its budget now ends with the trials it has: the sweep may be done.
                lifecycle.refresh_sweep_status(session=session, sweep=sweep)
                return None
            return None if trial is None else trial.id

    def fair_order(
        self,
        queued: list[NextTrial],
        active: list[Trial],
        pending: list[placement.PendingTrial],
        devices: Sequence[DeviceSnapshot],
        policy: placement.PackingPolicy,
    ) -> list[placement.PendingTrial]:
        """The pending trials in the order free slots go to them: each user's fair share of
        the devices first, a trial counted at the share 1/N it holds or is expected to hold."""
        held: dict[str, Fraction] = {}
        for trial in active:
            owner = trial.sweep.owner.name
            # Every launch records its N; one without (none should be) holds its device.
            held[owner] = held.get(owner, Fraction(0)) + Fraction(1, trial.split or 1)
        running = Counter(trial.sweep.owner.name for trial in active)
        by_id = {trial.trial_id: trial for trial in pending}
        order = fairshare.fair_order(
            (
                fairshare.Candidate(
                    trial_id=trial.id,
                    owner=trial.sweep.owner.name,
                    sweep_id=trial.sweep_id,
                    priority=trial.sweep.priority,
                    share=Fraction(1, placement.expected_split(by_id[trial.id], devices, policy)),
                )
                for trial in queued
            ),
            held=held,
            running=running,
            shares=self.shares,
            max_running=self.settings.max_running_per_user,
        )
        return [by_id[candidate.trial_id] for candidate in order]

    def policy(
        self, session: Session, sweeps: Iterable[Sweep], devices: Sequence[DeviceSnapshot]
    ) -> placement.PackingPolicy:
        """How densely to pack now: the settings, with the overheads measured so far, and the
        CUDA contexts measured of these sweeps' workloads on the devices."""
        return placement.PackingPolicy(
            default_split=self.settings.default_split,
            cpu_default_split=self.settings.cpu_split,
            overhead_mb=self.overheads.configured_mb,
            overhead_by_device=self.overheads.measured(),
            context_by_sweep=self.searches.contexts(sweeps, session=session, devices=devices),
            reserve_mb=self.settings.reserve_mb,
            min_memory_mb=self.settings.min_memory_mb,
        )


def credits(
    active: Sequence[Trial], tuned: Mapping[int, Mapping[str, int]]
) -> dict[tuple[str, int], Fraction]:
    """By device and sweep, the share the sweep's running trials hold beyond the N its split
    search has since raised on that device: its next trials take the slots the higher N opened
    at once, not once the trials launched under the lower N end (their phase is not measured
    anyway). On a device that caps memory, those trials' caps still hold what they got."""
    grown: dict[tuple[str, int], Fraction] = {}
    for trial in active:
        now = grown_split(trial, tuned)
        if trial.device is None or now is None:
            continue
        key = (trial.device, trial.sweep_id)
        grown[key] = grown.get(key, Fraction(0)) + Fraction(1, trial.split or 1) - Fraction(1, now)
    return grown


def running_trials(
    active: Sequence[Trial],
    *,
    raised: Mapping[int, int],
    devices: Sequence[DeviceSnapshot],
    group_of: Mapping[int, int],
    peaks: Mapping[tuple[str, int], int | None] | None = None,
) -> list[placement.RunningTrial]:
    """The active trials as placement counts them: `raised` gives the N each one's search has
    raised on its device since its launch (`grown_split`), `peaks` the most one trial of each
    sweep's workload held on its device in the phases its search measured (none: its cap
    stands).

    On a device where a raised trial may be budgeted below its cap, every trial there says
    what it holds: placement counts free memory as NVML reports it, which holds that already,
    and only the rest of each one's budget as growth. A raised trial's budget may drop only
    to what it may grow to (`grows_mb`)."""
    lowered = {t.device for t in active if t.id in raised}
    seen = {t.id: seen_mb(t, devices, group_of) for t in active if t.device in lowered}
    return [
        placement.RunningTrial(
            trial_id=t.id,
            device_key=t.device,
            slot=t.slot or 0,
            memory_limit_mb=t.memory_limit_mb,
            # Every launch records its N; one without (none should be) holds the device.
            split=t.split or 1,
            grown_split=raised.get(t.id),
            seen_mb=seen.get(t.id),
            sweep_id=t.sweep_id,
            grows_mb=(
                grows_mb(t, seen.get(t.id), (peaks or {}).get((t.device, t.sweep_id)))
                if t.id in raised
                else None
            ),
        )
        for t in active
        if t.device is not None
    ]


def grows_mb(trial: Trial, seen: int | None, peak: int | None) -> int | None:
    """What a trial may grow to, as far as known: what it holds now or the peak of its
    workload in a phase its search measured on the device's model (`peak`, a curve point's
    memory), whichever is more. None (its cap stands) before it reported (a young trial may
    hold its CUDA context alone, and grow to its cap: TensorFlow takes its slice at its first
    op, PyTorch allocates over its first steps) and where no measured phase gives a peak: a
    reading of a trial still allocating, or of a phase not measured yet, is no bound (two
    wave trials seen at 4,000 MiB that grow to 20 GB within their caps would run the card
    out of memory beside the new N's trials placed by that reading)."""
    if seen is None or peak is None or trial.last_report_at is None:
        return None
    return max(seen, peak)


def grown_split(trial: Trial, tuned: Mapping[int, Mapping[str, int]]) -> int | None:
    """The N the split search of the trial's sweep has raised on its device above the one the
    trial was launched under; None where it has not, or the sweep's N is fixed."""
    now = tuned.get(trial.sweep_id, {}).get(trial.device or "")
    if trial.device is None or trial.sweep.split is not None or not now:
        return None
    return now if now > (trial.split or 1) else None


def seen_mb(
    trial: Trial, devices: Sequence[DeviceSnapshot], group_of: Mapping[int, int]
) -> int | None:
    """What the trial's processes hold on its device as last probed, as the split search reads
    it (its leader's pid is its process group's id); None where the device does not tell."""
    device = next((d for d in devices if d.key == trial.device), None)
    if trial.pid is None:
        return None
    held = trial_memory(device, [trial.pid], group_of)
    return held[0] if held else None


def kept_turns(
    plan: placement.Plan,
    pending: Sequence[placement.PendingTrial],
    sweep_of: Mapping[int, int],
    devices: Sequence[DeviceSnapshot],
    policy: placement.PackingPolicy,
) -> list[int]:
    """The sweeps whose reserving trial keeps its turn at the next fill: those that wait for a
    larger share than another queued trial would take. A smaller trial would take the share it
    waits for at every fill; among trials of one size fair share decides, as ever."""
    by_id = {trial.trial_id: trial for trial in pending}
    smallest = min(Fraction(1, placement.expected_split(t, devices, policy)) for t in pending)
    return [
        sweep_of[trial_id]
        for trial_id in plan.reserved.values()
        if Fraction(1, placement.expected_split(by_id[trial_id], devices, policy)) > smallest
    ]


def heads_first(
    pending: Sequence[placement.PendingTrial], heads: Sequence[int], sweep_of: Mapping[int, int]
) -> list[placement.PendingTrial]:
    """The queue with the next trial of each sweep in `heads` (in their order) put first."""
    first: list[placement.PendingTrial] = []
    for sweep_id in heads:
        head = next(
            (t for t in pending if sweep_of[t.trial_id] == sweep_id and t not in first), None
        )
        if head is not None:
            first.append(head)
    return first + [trial for trial in pending if trial not in first]


def elsewhere(
    trial: placement.PendingTrial, others: Sequence[OtherNode], policy: placement.PackingPolicy
) -> Elsewhere:
    """Whether the trial's fixed split fits an idle device of another node, as that node's
    row describes its devices; each judged by its kind, as placement judges this node's."""
    # Measured overheads are this node's, by its device keys: other nodes' get the configured.
    configured = replace(policy, overhead_by_device={}, context_by_sweep={})
    reasons: list[str] = []
    unjudged: list[str] = []
    for node in others:
        snapshots = []
        for entry in node.devices:
            summary = DeviceSummary.read(entry)
            if summary is None or summary.kind not in KINDS:
                unjudged.append(f"node {node.name} lists a device gpumux cannot judge: {entry!r}")
            else:
                snapshots.append(summary.snapshot())
        reason = placement.never_fits(trial, snapshots, configured)
        if reason is None and snapshots:
            return Elsewhere(fits=True, why=f"node {node.name}'s devices may fit them")
        if reason is not None:
            reasons.append(f"on node {node.name}: {reason}")
    if unjudged:
        return Elsewhere(fits=None, why="; ".join(unjudged))
    return Elsewhere(fits=False, why="; ".join(reasons))
