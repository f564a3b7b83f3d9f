"""The host CPU as one device, for machines without a GPU: trials share its cores by threads."""

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

# Beyond two single-thread processes per core a trial gets under half a core: the only gain
# left is overlapping start-ups, which N = 2 x cores already captures.
TRIALS_PER_CORE = 2


class CpuKind(DeviceKind):
    """The CPU: no memory is divided; each trial gets an equal share of the cores as threads."""

    name: ClassVar[str] = "cpu"
    shared_by: ClassVar[str] = "threads"
    framework_device: ClassVar[Literal["cuda", "cpu"]] = "cpu"
    lists_processes: ClassVar[bool] = False
    # Its ceiling follows free memory, which the running trials themselves hold.
    stable_ceiling: ClassVar[bool] = False
    # Its trials' work is their threads, 1/N of the cores each: a lower N's hold more of them,
    # and the new N's beside them would read slow.
    raised_beside: ClassVar[bool] = False

    def model_name(self, device: DeviceSnapshot) -> str:
        """The CPU model and its usable cores: a daemon given fewer cores finds another N."""
        return f"{device.name}, {device.cpu_count or 1} cores"

    def default_split(self, device: DeviceSnapshot, rules: PackingRules) -> int:
        """The configured trials on the CPU, else one per core."""
        return rules.cpu_default_split or device.cpu_count or 1

    def ceiling(
        self,
        device: DeviceSnapshot,
        *,
        reserve_mb: int,
        min_memory_mb: int,
        overhead_mb: int,
        cpu_trial_mb: int,
    ) -> int:
        """What free memory allows at `cpu_trial_mb` a trial, and at most two trials per core."""
        room = min(
            device.memory_free_mb or 0,
            TRIALS_PER_CORE * (device.cpu_count or 1) * cpu_trial_mb,
        )
        return max(1, room // cpu_trial_mb)

    def first_split(
        self, device: DeviceSnapshot, ceiling: int, *, steps: Sequence[int], cores: int
    ) -> FirstSplit:
        """One trial per core: each trial's threads get a core of their own."""
        cores = device.cpu_count or 1
        split = max(1, min(cores, ceiling))
        return FirstSplit(split=split, why=f"the device's {cores} core{'s' if cores > 1 else ''}")

    def work_cores(self, device: DeviceSnapshot) -> int | None:
        """The device's cores: its trials compute on them."""
        return device.cpu_count or 1

    def room_mb(
        self,
        device: DeviceSnapshot,
        *,
        reserve_mb: int,
        our_pids: Collection[int],
        our_caps: Sequence[int | None],
        overhead_mb: int,
    ) -> int:
        """Nothing: trials on the CPU are held to threads, not to memory."""
        return 0

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
        """An equal share of the cores, at least one thread."""
        return TrialCap(memory_limit_mb=None, cpu_threads=cpu_share(device, split) or 1)

    def never_fits(
        self, device: DeviceSnapshot, *, split: int, overhead_mb: int, rules: PackingRules
    ) -> str | None:
        """Any split fits: threads are shared, not memory."""
        return None

    def cuda_visible_devices(self, device: DeviceSnapshot) -> str:
        """No GPU: frameworks then run on the CPU."""
        return ""

    def overhead_beyond_cap(
        self, device: DeviceSnapshot, group_of: Mapping[int, int], caps: Mapping[int, int]
    ) -> int | None:
        """None: no memory cap to be beyond."""
        return None

    def trial_memory_mb(
        self, device: DeviceSnapshot, pids: Collection[int], *, resident: ResidentMemory
    ) -> int | None:
        """The resident memory of the trial's processes."""
        return resident(pids)
