"""Which queued trial goes to which device slot, with which memory cap: a pure function."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from gpumux.devices.probes import DeviceSnapshot


@dataclass(frozen=True)
class RunningTrial:
    """A trial that holds a slot on a device."""

    trial_id: int
    device_key: str
    slot: int
    memory_limit_mb: int | None


@dataclass(frozen=True)
class PendingTrial:
    """A queued trial; split is the sweep's fixed N, None for the tuned or the default N.

    `tuned` holds the N the split search chose for the trial's workload on each device.
    """

    trial_id: int
    split: int | None
    tuned: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.split is not None and self.split < 1:
            raise ValueError(f"trial {self.trial_id}: split must be at least 1, got {self.split}")


@dataclass(frozen=True)
class PackingPolicy:
    """How densely to pack: default N per device kind and the memory kept out of the slices."""

    default_split: int = 2
    cpu_default_split: int | None = None
    # CUDA context and cuDNN/cuBLAS workspaces live outside the TensorFlow slice.
    overhead_mb: int = 1024
    overhead_by_device: Mapping[str, int] = field(default_factory=dict)
    reserve_mb: int = 512
    min_memory_mb: int = 256

    def __post_init__(self) -> None:
        if self.default_split < 1:
            raise ValueError(f"default_split must be at least 1, got {self.default_split}")
        if self.cpu_default_split is not None and self.cpu_default_split < 1:
            raise ValueError(f"cpu_default_split must be at least 1, got {self.cpu_default_split}")

    def overhead_for(self, device_key: str) -> int:
        """Memory a trial needs beyond its cap on this device: measured, else the default."""
        return self.overhead_by_device.get(device_key, self.overhead_mb)


@dataclass(frozen=True)
class Placement:
    """A decision: start this trial in this slot of this device, with this cap."""

    trial_id: int
    device_key: str
    slot: int
    split: int
    memory_limit_mb: int | None
    cpu_threads: int | None


def foreign_memory_mb(
    device: DeviceSnapshot,
    our_pids: Collection[int],
    running_on_device: Sequence[RunningTrial],
    overhead_mb: int,
) -> int:
    """GPU memory held by processes that are not ours."""
    foreign = [p for p in device.processes or () if p.pid not in our_pids]
    if device.processes is not None and all(p.used_memory_mb is not None for p in foreign):
        return sum(p.used_memory_mb or 0 for p in foreign)
    if device.memory_used_mb is None:
        return 0
    # No process list, or one whose memory NVML cannot tell: whatever is used beyond what our
    # own trials may hold belongs to others (never counted as zero: others would run out).
    ours = sum((t.memory_limit_mb or 0) + overhead_mb for t in running_on_device)
    return max(0, device.memory_used_mb - ours)


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
        if device.kind == "cpu" or device.memory_total_mb is None:
            return None
        overhead = policy.overhead_for(device.key)
        room = device.memory_total_mb - policy.reserve_mb
        cap = room // trial.split - overhead
        if cap >= policy.min_memory_mb:
            return None
        largest = max(1, room // (policy.min_memory_mb + overhead))
        reasons.append(
            f"split {trial.split} leaves {cap} MB per trial on {device.name} "
            f"({device.memory_total_mb} MB, {policy.reserve_mb} MB kept free, {overhead} MB "
            f"overhead per process; the smallest slice is {policy.min_memory_mb} MB): "
            f"use --split {largest} or less"
        )
    return "; ".join(reasons) or None


def measured_overhead_mb(
    device: DeviceSnapshot, group_of: Mapping[int, int], caps: Mapping[int, int]
) -> int | None:
    """The largest memory one of our trials holds beyond its slice, as NVML sees it.

    `group_of` maps our pids to their trial's process group, `caps` a group to its slice.
    A trial's processes are summed (a script may fork workers that touch the GPU). None
    when no trial on the device has passed its slice yet (frameworks allocate lazily).
    """
    if device.kind != "gpu" or not device.processes:
        return None
    held: dict[int, int] = {}
    for process in device.processes:
        group = group_of.get(process.pid)
        if group is not None and group in caps and process.used_memory_mb is not None:
            held[group] = held.get(group, 0) + process.used_memory_mb
    beyond = [used - caps[group] for group, used in held.items() if used > caps[group]]
    return max(beyond, default=None)


@dataclass
class _Device:
    """The running trials and remaining room of one usable device during one place() call."""

    snapshot: DeviceSnapshot
    overhead_mb: int
    usable_mb: int
    held_mb: int
    trials: int
    slots: set[int]

    def fit(self, trial: PendingTrial, policy: PackingPolicy) -> Placement | None:
        """Where the trial would go on this device, or None when it does not fit."""
        cpu = self.snapshot.kind == "cpu"
        cpu_count = self.snapshot.cpu_count or 1
        split = (
            trial.split
            or trial.tuned.get(self.snapshot.key)
            or ((policy.cpu_default_split or cpu_count) if cpu else policy.default_split)
        )
        if self.trials + 1 > split:
            return None
        cap = None
        if not cpu:
            cap = self.usable_mb // split - self.overhead_mb
            if cap < policy.min_memory_mb or cap + self.overhead_mb > self.usable_mb - self.held_mb:
                return None
        return Placement(
            trial_id=trial.trial_id,
            device_key=self.snapshot.key,
            slot=min(set(range(split)) - self.slots),
            split=split,
            memory_limit_mb=cap,
            cpu_threads=max(1, cpu_count // split) if cpu else None,
        )

    def take(self, placement: Placement) -> None:
        """Count a placement made in this call as running here."""
        self.trials += 1
        self.slots.add(placement.slot)
        if placement.memory_limit_mb is not None:
            self.held_mb += placement.memory_limit_mb + self.overhead_mb

    def free_slots(self, split: int) -> int:
        """Slots left under this split: the rank of the device for the next trial."""
        return split - self.trials


def _usable_devices(
    devices: Sequence[DeviceSnapshot],
    running: Sequence[RunningTrial],
    policy: PackingPolicy,
    our_pids: Collection[int],
) -> list[_Device]:
    usable = []
    for device in devices:
        if device.error is not None:
            continue
        on_device = [t for t in running if t.device_key == device.key]
        overhead = policy.overhead_for(device.key)
        room = 0
        if device.kind == "gpu":
            if device.memory_total_mb is None:
                # Without the total no cap can be computed.
                continue
            foreign = foreign_memory_mb(device, our_pids, on_device, overhead)
            room = device.memory_total_mb - policy.reserve_mb - foreign
        usable.append(
            _Device(
                snapshot=device,
                overhead_mb=overhead,
                usable_mb=room,
                held_mb=sum((t.memory_limit_mb or 0) + overhead for t in on_device),
                trials=len(on_device),
                slots={t.slot for t in on_device},
            )
        )
    return usable


def place(
    *,
    devices: Sequence[DeviceSnapshot],
    running: Sequence[RunningTrial],
    pending: Sequence[PendingTrial],
    policy: PackingPolicy,
    our_pids: Collection[int] = (),
) -> list[Placement]:
    """Placements for the head of the FIFO queue, stopping at the first trial that fits nowhere."""
    usable = _usable_devices(devices, running, policy, our_pids)
    placements = []
    for trial in pending:
        fits = [(d, p) for d in usable if (p := d.fit(trial, policy)) is not None]
        if not fits:
            # Strict FIFO: a trial waiting for room is never overtaken by smaller later ones.
            break
        device, placement = min(
            fits, key=lambda f: (-f[0].free_slots(f[1].split), f[0].snapshot.index)
        )
        device.take(placement)
        placements.append(placement)
    return placements
