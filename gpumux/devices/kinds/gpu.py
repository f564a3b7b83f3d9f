"""A whole GPU, shared by giving each trial a logical-device memory slice of it, and a share of
the host's cores."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import ClassVar, Literal

from gpumux.devices.kinds.base import (
    DeviceKind,
    FirstSplit,
    PackingRules,
    ResidentMemory,
    TrialCap,
    cpu_share,
)
from gpumux.devices.snapshot import DeviceSnapshot


def foreign_memory_mb(
    device: DeviceSnapshot,
    our_pids: Collection[int],
    our_caps: Sequence[int | None],
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
    ours = sum((cap or 0) + overhead_mb for cap in our_caps)
    return max(0, device.memory_used_mb - ours)


class GpuKind(DeviceKind):
    """A GPU NVML reports: trials get equal memory slices of what others leave free, and threads
    for an equal share of the GPU's block of the host's cores (a process that feeds a GPU runs
    its input pipeline, its kernel launches and its BLAS on the CPU: N trials each with all of
    the host's threads oversubscribe it N times)."""

    name: ClassVar[str] = "gpu"
    shared_by: ClassVar[str] = "memory slices"
    framework_device: ClassVar[Literal["cuda", "cpu"]] = "cuda"
    lists_processes: ClassVar[bool] = True

    def usable(self, device: DeviceSnapshot) -> bool:
        """Probed without error and with its total memory known: no slice can be cut without."""
        return device.error is None and device.memory_total_mb is not None

    def model_name(self, device: DeviceSnapshot) -> str:
        """The GPU model: twin GPUs share one profile."""
        return device.name

    def default_split(self, device: DeviceSnapshot, rules: PackingRules) -> int:
        """The configured trials per GPU."""
        return rules.default_split

    def ceiling(
        self,
        device: DeviceSnapshot,
        *,
        reserve_mb: int,
        min_memory_mb: int,
        overhead_mb: int,
        cpu_trial_mb: int,
    ) -> int:
        """As many trials as the smallest slices and their overhead fit in the memory."""
        room = (device.memory_total_mb or 0) - reserve_mb
        return max(1, room // (min_memory_mb + overhead_mb))

    def first_split(
        self, device: DeviceSnapshot, ceiling: int, *, steps: Sequence[int], cores: int
    ) -> FirstSplit:
        """A quarter of the memory ceiling, and no more trials than the host has cores.

        The ceiling gives each trial the smallest slice allowed (`min_memory_mb`), which few
        real trainings fit in: starting there (N=34 on an 80 GB card) would run a wave of
        trials out of memory before the search backs off. A quarter of it leaves each trial
        four times that slice. Each trial of a launch-bound network keeps a core busy
        dispatching kernels (on one H200 the knee came near its host's 16 cores): more trials
        than cores wait for one. The search climbs from there when both allow. A guess from
        memory first runs half as many trials, which learn what a trial holds (`probe`).
        """
        memory = max(1, ceiling // 4)
        if cores <= memory:
            return FirstSplit(split=max(1, cores), why=f"the host's {cores} cores")
        split = max((step for step in steps if 1 <= step <= memory), default=1)
        # A guess from memory assumes what a trial holds: half of it first, whose slices hold
        # twice that, shows the trials' real memory before the guess's wave is launched.
        return FirstSplit(
            split=split,
            why=f"a quarter of the N whose smallest slices fit on {device.name}",
            probe=split // 2 or None,
        )

    def room_mb(
        self,
        device: DeviceSnapshot,
        *,
        reserve_mb: int,
        our_pids: Collection[int],
        our_caps: Sequence[int | None],
        overhead_mb: int,
    ) -> int:
        """The total less the reserve and what processes not ours hold."""
        foreign = foreign_memory_mb(device, our_pids, our_caps, overhead_mb)
        return (device.memory_total_mb or 0) - reserve_mb - foreign

    def cap(
        self,
        device: DeviceSnapshot,
        *,
        split: int,
        room_mb: int,
        held_mb: int,
        overhead_mb: int,
        rules: PackingRules,
    ) -> TrialCap | None:
        """An equal slice of the room, less the overhead, if it is large enough and still free;
        1/N of the GPU's cores as threads, as 1/N of its memory."""
        memory = room_mb // split - overhead_mb
        if memory < rules.min_memory_mb or memory + overhead_mb > room_mb - held_mb:
            return None
        return TrialCap(memory_limit_mb=memory, cpu_threads=cpu_share(device, split))

    def never_fits(
        self, device: DeviceSnapshot, *, split: int, overhead_mb: int, rules: PackingRules
    ) -> str | None:
        """Why slices of an idle GPU at `split` fall below the smallest slice, and what fits."""
        if device.memory_total_mb is None:
            return None
        room = device.memory_total_mb - rules.reserve_mb
        memory = room // split - overhead_mb
        if memory >= rules.min_memory_mb:
            return None
        largest = max(1, room // (rules.min_memory_mb + overhead_mb))
        return (
            f"split {split} leaves {memory} MB per trial on {device.name} "
            f"({device.memory_total_mb} MB, {rules.reserve_mb} MB kept free, {overhead_mb} MB "
            f"overhead per process; the smallest slice is {rules.min_memory_mb} MB): "
            f"use --split {largest} or less"
        )

    def cuda_visible_devices(self, device: DeviceSnapshot) -> str:
        """The GPU's UUID, its index without one."""
        return device.uuid or str(device.index)

    def overhead_beyond_cap(
        self, device: DeviceSnapshot, group_of: Mapping[int, int], caps: Mapping[int, int]
    ) -> int | None:
        """From NVML's per-process memory, summed per trial (a script may fork GPU workers).

        None while no trial has passed its slice yet: frameworks allocate lazily.
        """
        held: dict[int, int] = {}
        for process in device.processes or ():
            group = group_of.get(process.pid)
            if group is not None and group in caps and process.used_memory_mb is not None:
                held[group] = held.get(group, 0) + process.used_memory_mb
        beyond = [used - caps[group] for group, used in held.items() if used > caps[group]]
        return max(beyond, default=None)

    def trial_memory_mb(
        self, device: DeviceSnapshot, pids: Collection[int], *, resident: ResidentMemory
    ) -> int | None:
        """What NVML says the trial's processes hold on this GPU; None when it lists none."""
        used = [
            p.used_memory_mb
            for p in device.processes or ()
            if p.pid in pids and p.used_memory_mb is not None
        ]
        return sum(used) if used else None
