"""Which queued trial goes to which device slot, with which memory cap: a pure function.

A trial launched under split N holds 1/N of its device, whatever its workload: a device is full
when its trials' shares add up to 1, so several workloads pack one device by their own N. Once
the split search raises a sweep's N on a device, the share its trials of the lower N hold beyond
1/(new N) is the sweep's credit there: its next trials may use it at once (a slot N opened),
no other sweep's may. On a device that caps memory, such a trial seen holding no more than a
slice of the new N is budgeted at that slice rather than its own cap, so the new N's trials fit
beside it at once too, within what the device's free memory allows.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from gpumux.devices.kinds import kind_of
from gpumux.devices.kinds.base import DeviceKind
from gpumux.devices.overhead import trial_overhead_mb
from gpumux.devices.snapshot import DeviceSnapshot


@dataclass(frozen=True)
class RunningTrial:
    """A trial that holds a slot on a device."""

    trial_id: int
    device_key: str
    slot: int
    memory_limit_mb: int | None
    # The N it was launched under: it holds 1/split of the device.
    split: int
    # The higher N its sweep's split search has since chosen on the device (None: not raised,
    # or a fixed split), and what its processes were last seen holding there (None: unseen).
    grown_split: int | None = None
    seen_mb: int | None = None
    # What a raised trial may grow to, as far as known: what it holds, or what a trial of its
    # workload was seen holding in its search's phases if more (None: not known, as for a
    # trial that has not reported yet: its cap).
    grows_mb: int | None = None
    # Its sweep (None: unknown), whose workload's measured context may be its overhead.
    sweep_id: int | None = None


@dataclass(frozen=True)
class PendingTrial:
    """A queued trial; split is the sweep's fixed N, None for the tuned or the default N.

    `tuned` holds the N the split search chose for the trial's workload on each device.
    """

    trial_id: int
    split: int | None
    tuned: Mapping[str, int] = field(default_factory=dict)
    # The sweep it belongs to: the one whose credit on a device it may use.
    sweep_id: int | None = None

    def __post_init__(self) -> None:
        if self.split is not None and self.split < 1:
            raise ValueError(f"trial {self.trial_id}: split must be at least 1, got {self.split}")


@dataclass(frozen=True)
class PackingPolicy:
    """How densely to pack: default N per device kind and the memory kept out of the slices."""

    default_split: int = 2
    cpu_default_split: int | None = None
    # CUDA context and cuDNN/cuBLAS workspaces live outside the TensorFlow slice: configured,
    # and by device as measured (gpumux.devices.accounting.Overheads, which the split search's
    # ceiling reads too); by device and sweep, the CUDA context its workload's split search
    # measured there (SplitSearches.contexts).
    overhead_mb: int = 1024
    overhead_by_device: Mapping[str, int] = field(default_factory=dict)
    context_by_sweep: Mapping[tuple[str, int], int] = field(default_factory=dict)
    reserve_mb: int = 512
    min_memory_mb: int = 256

    def __post_init__(self) -> None:
        if self.default_split < 1:
            raise ValueError(f"default_split must be at least 1, got {self.default_split}")
        if self.cpu_default_split is not None and self.cpu_default_split < 1:
            raise ValueError(f"cpu_default_split must be at least 1, got {self.cpu_default_split}")

    def overhead_for(self, device_key: str, sweep_id: int | None = None) -> int:
        """Memory a trial (of `sweep_id`) needs beyond its cap on this device (see
        `devices.overhead.trial_overhead_mb`)."""
        return trial_overhead_mb(
            configured=self.overhead_mb,
            seen=self.overhead_by_device.get(device_key),
            context=None if sweep_id is None else self.context_by_sweep.get((device_key, sweep_id)),
        )


@dataclass(frozen=True)
class Placement:
    """A decision: start this trial in this slot of this device, with this cap."""

    trial_id: int
    device_key: str
    slot: int
    split: int
    memory_limit_mb: int | None
    cpu_threads: int | None


def never_fits(
    trial: PendingTrial, devices: Sequence[DeviceSnapshot], policy: PackingPolicy
) -> str | None:
    """Why a trial's fixed split fits no device even when the device is empty, or None."""
    if trial.split is None:
        return None
    reasons = []
    for device in devices:
        if device.error is not None:
            continue
        reason = kind_of(device).never_fits(
            device,
            split=trial.split,
            overhead_mb=policy.overhead_for(device.key, trial.sweep_id),
            rules=policy,
        )
        if reason is None:
            return None
        reasons.append(reason)
    return "; ".join(reasons) or None


def expected_split(
    trial: PendingTrial, devices: Sequence[DeviceSnapshot], policy: PackingPolicy
) -> int:
    """The N the trial will likely run under, before it is placed: its sweep's, else the tuned
    or the default N on the first usable device (its 1/N is what fair share counts it at)."""
    if trial.split is not None:
        return trial.split
    for device in devices:
        kind = kind_of(device)
        if kind.usable(device):
            return trial.tuned.get(device.key) or kind.default_split(device, policy)
    return policy.default_split


@dataclass
class _Device:
    """The running trials and remaining room of one usable device during one plan() call."""

    snapshot: DeviceSnapshot
    kind: DeviceKind
    usable_mb: int
    held_mb: int
    shares: Fraction
    slots: set[int]
    # Per sweep, the share its trials of a lower N hold beyond the N its search has now chosen.
    credits: Mapping[int, Fraction] = field(default_factory=dict)
    # Where a running trial is budgeted below its cap: the free memory NVML reports, less the
    # reserve and what our trials may still grow into within their budgets; None elsewhere.
    spare_mb: int | None = None

    def split_for(self, trial: PendingTrial, policy: PackingPolicy) -> int:
        """The N the trial would run under here: its sweep's, the tuned one, or the default."""
        return (
            trial.split
            or trial.tuned.get(self.snapshot.key)
            or self.kind.default_split(self.snapshot, policy)
        )

    def short_by(self, trial: PendingTrial, policy: PackingPolicy) -> Fraction:
        """The share of the device that must free before the trial fits (<= 0: it fits)."""
        credit = Fraction(0)
        if trial.sweep_id is not None:
            credit = self.credits.get(trial.sweep_id, credit)
        return self.shares - credit + Fraction(1, self.split_for(trial, policy)) - 1

    def wait_rank(self, trial: PendingTrial, policy: PackingPolicy) -> tuple[bool, Fraction, int]:
        """How soon a trial that does not fit here would: share to free, least first; a device
        where only memory stops it last, as it may be held by a process that never ends."""
        short_by = self.short_by(trial, policy)
        return (short_by <= 0, short_by, self.snapshot.index)

    def fit(self, trial: PendingTrial, policy: PackingPolicy) -> Placement | None:
        """Where the trial would go on this device, or None when it does not fit."""
        split = self.split_for(trial, policy)
        if self.short_by(trial, policy) > 0:
            return None
        overhead = policy.overhead_for(self.snapshot.key, trial.sweep_id)
        cap = self.kind.cap(
            self.snapshot,
            split=split,
            room_mb=self.usable_mb,
            held_mb=self.held_mb,
            overhead_mb=overhead,
            rules=policy,
        )
        if cap is None:
            return None
        spare = self.spare_mb
        if spare is not None and (cap.memory_limit_mb or 0) + overhead > spare:
            return None
        return Placement(
            trial_id=trial.trial_id,
            device_key=self.snapshot.key,
            slot=next(i for i in itertools.count() if i not in self.slots),
            split=split,
            memory_limit_mb=cap.memory_limit_mb,
            cpu_threads=cap.cpu_threads,
        )

    def take(self, placement: Placement, *, overhead_mb: int) -> None:
        """Count a placement made in this call as running here, with the overhead its trial
        was budgeted."""
        self.shares += Fraction(1, placement.split)
        self.slots.add(placement.slot)
        if placement.memory_limit_mb is not None:
            self.held_mb += placement.memory_limit_mb + overhead_mb
            if self.spare_mb is not None:
                self.spare_mb -= placement.memory_limit_mb + overhead_mb

    def free_slots(self, split: int) -> Fraction:
        """How many more trials of this split the free share holds: the device's rank."""
        return (1 - self.shares) * split


def _usable_devices(
    devices: Sequence[DeviceSnapshot],
    running: Sequence[RunningTrial],
    policy: PackingPolicy,
    our_pids: Collection[int],
    credits: Mapping[tuple[str, int], Fraction],
) -> list[_Device]:
    usable = []
    for device in devices:
        kind = kind_of(device)
        if not kind.usable(device):
            continue
        on_device = [t for t in running if t.device_key == device.key]
        room = kind.room_mb(
            device,
            reserve_mb=policy.reserve_mb,
            our_pids=our_pids,
            our_caps=[t.memory_limit_mb for t in on_device],
            overhead_mb=policy.overhead_for(device.key),
        )
        budgets = {t.trial_id: _budget_mb(t, device, kind, room, policy) for t in on_device}
        spare = None
        caps = sum(
            (t.memory_limit_mb or 0) + policy.overhead_for(device.key, t.sweep_id)
            for t in on_device
        )
        if device.memory_free_mb is not None and sum(budgets.values()) < caps:
            # What they hold is in NVML's used memory already; what they may still take is not.
            growth = sum(max(0, budgets[t.trial_id] - (t.seen_mb or 0)) for t in on_device)
            spare = device.memory_free_mb - policy.reserve_mb - growth
        usable.append(
            _Device(
                snapshot=device,
                kind=kind,
                usable_mb=room,
                held_mb=sum(budgets.values()),
                shares=sum((Fraction(1, t.split) for t in on_device), Fraction(0)),
                slots={t.slot for t in on_device},
                credits={
                    sweep_id: credit
                    for (key, sweep_id), credit in credits.items()
                    if key == device.key
                },
                spare_mb=spare,
            )
        )
    return usable


def _budget_mb(
    trial: RunningTrial,
    device: DeviceSnapshot,
    kind: DeviceKind,
    room_mb: int,
    policy: PackingPolicy,
) -> int:
    """The memory a running trial is budgeted at: its cap and overhead, or, where its sweep's
    search has raised N since it was launched and what it may grow to (`grows_mb`: what it and
    its workload's trials were seen holding, once it reported) fits a slice of the new N, that
    slice and overhead. A trial that takes its whole slice (TensorFlow) shows its cap and keeps
    it; one not known yet keeps it too. One that grows past what was seen may still run a trial
    out of memory: the search backs off from that as from any."""
    overhead = policy.overhead_for(device.key, trial.sweep_id)
    own = (trial.memory_limit_mb or 0) + overhead
    if trial.memory_limit_mb is None or trial.grown_split is None or trial.grows_mb is None:
        return own
    given = kind.cap(
        device,
        split=trial.grown_split,
        room_mb=room_mb,
        held_mb=0,
        overhead_mb=overhead,
        rules=policy,
    )
    if given is None or given.memory_limit_mb is None or trial.grows_mb > given.memory_limit_mb:
        return own
    return min(own, given.memory_limit_mb + overhead)


@dataclass(frozen=True)
class Plan:
    """One plan() call's decisions, and the devices that trials fitting nowhere reserved."""

    placements: list[Placement]
    # Device key to the trial that reserved it, in the order they did.
    reserved: dict[str, int]


def plan(
    *,
    devices: Sequence[DeviceSnapshot],
    running: Sequence[RunningTrial],
    pending: Sequence[PendingTrial],
    policy: PackingPolicy,
    our_pids: Collection[int] = (),
    credits: Mapping[tuple[str, int], Fraction] | None = None,
) -> Plan:
    """Placements for the queue, in its order; a trial that fits nowhere reserves a device.

    A trial that fits on no open device reserves the open device where it will fit soonest:
    the one with the least share to free before it fits (ties: the lower index), a device where
    it lacks only memory after every one where it waits for share. Trials behind
    it may still go to other devices, never to a reserved one, so the reserving trial is next
    there once enough share frees. With one device this is strict FIFO. `credits`, by device
    key and sweep: share a sweep's trials of a lower N hold beyond its new N (filling.credits),
    free to that sweep's trials alone.
    """
    usable = _usable_devices(devices, running, policy, our_pids, credits or {})
    reserved: dict[str, int] = {}
    placements = []
    for trial in pending:
        open_devices = [device for device in usable if device.snapshot.key not in reserved]
        if not open_devices:
            break
        fits = [(d, p) for d in open_devices if (p := d.fit(trial, policy)) is not None]
        if not fits:
            soonest = min(open_devices, key=lambda d: d.wait_rank(trial, policy))
            reserved[soonest.snapshot.key] = trial.trial_id
            continue
        device, placement = min(
            fits, key=lambda f: (-f[0].free_slots(f[1].split), f[0].snapshot.index)
        )
        device.take(placement, overhead_mb=policy.overhead_for(device.snapshot.key, trial.sweep_id))
        placements.append(placement)
    return Plan(placements=placements, reserved=reserved)
