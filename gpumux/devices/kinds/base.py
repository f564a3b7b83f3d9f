"""The device-kind interface: what a device offers, how a trial is capped on it, what it starts
with (its environment, its cores), how its memory is accounted. Pure: placement calls it, so it
reads nothing from the host itself."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol

from gpumux.devices.snapshot import DeviceSnapshot

# The resident memory of some processes together, in MiB; None when none could be read.
ResidentMemory = Callable[[Collection[int]], int | None]
# The thread pools a trial's share of the cores sizes, read when their library loads: OpenMP
# (PyTorch's intra-op pool, most BLAS builds), MKL and OpenBLAS.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class PackingRules(Protocol):
    """The configured numbers a kind packs by (placement's PackingPolicy has them)."""

    @property
    def default_split(self) -> int: ...

    @property
    def cpu_default_split(self) -> int | None: ...

    @property
    def reserve_mb(self) -> int: ...

    @property
    def min_memory_mb(self) -> int: ...


@dataclass(frozen=True)
class TrialCap:
    """How one trial is held to its share of a device: a memory limit, a thread count, or both."""

    memory_limit_mb: int | None
    cpu_threads: int | None


@dataclass(frozen=True)
class TrialSetup:
    """What a trial on a device starts with: the device's part of its environment (the trial
    contract's device variables), and the cores it is pinned to (None: not pinned)."""

    env: Mapping[str, str]
    cpu_affinity: tuple[int, ...] | None


def cpu_share(device: DeviceSnapshot, split: int) -> int | None:
    """A trial's threads at `split`: its 1/N of the device's cores, one at least; None when the
    device's cores are unknown."""
    if device.cpu_count is None:
        return None
    return max(1, device.cpu_count // split)


def pinned_cores(cores: Sequence[int], *, slot: int, threads: int) -> tuple[int, ...]:
    """Slot `slot`'s block of `threads` neighbouring cores: disjoint from the other slots' while
    trials of one split fill the device and fit its cores; past them, the blocks wrap round."""
    blocks = max(1, len(cores) // threads)
    start = (slot % blocks) * threads
    return tuple(cores[start : start + threads])


@dataclass(frozen=True)
class FirstSplit:
    """Where a split search with nothing measured to go by starts on a device, and why."""

    split: int
    why: str
    # A smaller first wave that learns what a trial holds before the guess's wave (None: the
    # guess is not memory's): where memory bounds N below the guess, the guess's wave would
    # run out of memory at once, with the device idle through its start-up.
    probe: int | None = None


class DeviceKind(ABC):
    """One kind of device; a new kind (MPS, MIG) is one subclass registered in KINDS."""

    # DeviceSnapshot.kind, and the trial's GPUMUX_DEVICE_KIND.
    name: ClassVar[str]
    # How trials share the device, as the API's description of the kind says it.
    shared_by: ClassVar[str]
    # What the trial's frameworks train on and are capped on (GPUMUX_FRAMEWORK_DEVICE): "cuda"
    # (a memory fraction or a logical device of the GPU, plus threads of the host's cores) or
    # "cpu" (threads only). A kind the frameworks see as a CUDA GPU (MPS, MIG) keeps "cuda".
    framework_device: ClassVar[Literal["cuda", "cpu"]]
    # Whether snapshots list each process's memory, so that our process groups are worth listing.
    lists_processes: ClassVar[bool]
    # Whether `ceiling` is the device's and the workload's (worth keeping in a profile), not
    # what free memory allows at one moment.
    stable_ceiling: ClassVar[bool] = True
    # Whether a raised N's trials may be measured beside those left from a lower N (their
    # work is the device's, whatever threads each got by its N), or only once those ended.
    raised_beside: ClassVar[bool] = True

    def usable(self, device: DeviceSnapshot) -> bool:
        """Whether trials may be placed on the device as probed."""
        return device.error is None

    @abstractmethod
    def model_name(self, device: DeviceSnapshot) -> str:
        """What a throughput profile is kept per: devices of one model share their best N."""

    @abstractmethod
    def default_split(self, device: DeviceSnapshot, rules: PackingRules) -> int:
        """Trials at once on the device when neither the sweep nor the split search says."""

    @abstractmethod
    def ceiling(
        self,
        device: DeviceSnapshot,
        *,
        reserve_mb: int,
        min_memory_mb: int,
        overhead_mb: int,
        cpu_trial_mb: int,
    ) -> int:
        """The largest N the split search should try on the device, at least 1."""

    def first_split(
        self, device: DeviceSnapshot, ceiling: int, *, steps: Sequence[int], cores: int
    ) -> FirstSplit:
        """The kind's guess at the best N, at most `ceiling` (`steps`: the N a search climbs by;
        `cores`: the host's, which the trials run on); a kind without one starts from a single
        trial."""
        return FirstSplit(split=1, why=f"no guess for a {self.name} device")

    def known_split(self, ceiling: int, *, steps: Sequence[int], cores: int) -> FirstSplit:
        """Where a search starts once its first wave (`FirstSplit.probe`) showed what a trial
        holds, so that `ceiling` is what memory allows: the largest of `steps` below it (a step
        short of it: the fit is read off the wave's first steps, which a framework may outgrow;
        the climb goes on to it where the step gains) and within the host's `cores` (more
        trials than cores wait for one). Starting high costs little where the best N is low (a
        few trials more share the device), and a climb from low N runs most of the device idle
        where it is high."""
        split = max((step for step in steps if 1 <= step < ceiling and step <= cores), default=1)
        return FirstSplit(
            split=split,
            why=f"the step below the {ceiling} trials memory allows, within {cores} cores",
        )

    def work_cores(self, device: DeviceSnapshot) -> int | None:
        """The cores that do the trials' work on this device, which bound what N trials can do
        together; None where the device itself does it (a GPU)."""
        return None

    @abstractmethod
    def room_mb(
        self,
        device: DeviceSnapshot,
        *,
        reserve_mb: int,
        our_pids: Collection[int],
        our_caps: Sequence[int | None],
        overhead_mb: int,
    ) -> int:
        """Memory our trials may divide among them, given what others' processes hold.

        `our_caps` are the memory limits of our trials running on the device.
        """

    @abstractmethod
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
        """A new trial's cap at `split`, given the room and what our trials hold; None: no fit."""

    @abstractmethod
    def never_fits(
        self, device: DeviceSnapshot, *, split: int, overhead_mb: int, rules: PackingRules
    ) -> str | None:
        """Why `split` trials fit not even on the idle device, and what would; None if they do."""

    @abstractmethod
    def cuda_visible_devices(self, device: DeviceSnapshot) -> str:
        """CUDA_VISIBLE_DEVICES for a trial on the device."""

    def trial_setup(
        self, device: DeviceSnapshot, *, slot: int, cap: TrialCap, pin: bool
    ) -> TrialSetup:
        """What a trial in `slot` with `cap` starts with: its device, memory and threads in its
        environment, and with `pin` its own block of the device's cores (a kind that needs more,
        MPS's thread percentage, adds it here)."""
        env = {
            "GPUMUX_DEVICE_KIND": self.name,
            "GPUMUX_FRAMEWORK_DEVICE": self.framework_device,
            "CUDA_VISIBLE_DEVICES": self.cuda_visible_devices(device),
        }
        if device.memory_total_mb is not None:
            env["GPUMUX_DEVICE_MEMORY_MB"] = str(device.memory_total_mb)
        if cap.memory_limit_mb is not None:
            env["GPUMUX_MEMORY_LIMIT_MB"] = str(cap.memory_limit_mb)
        affinity = None
        if cap.cpu_threads is not None:
            env["GPUMUX_CPU_THREADS"] = str(cap.cpu_threads)
            env.update(dict.fromkeys(THREAD_VARIABLES, str(cap.cpu_threads)))
            if pin and device.cpu_cores:
                affinity = pinned_cores(device.cpu_cores, slot=slot, threads=cap.cpu_threads)
                env["GPUMUX_CPU_CORES"] = ",".join(map(str, affinity))
        return TrialSetup(env=env, cpu_affinity=affinity)

    @abstractmethod
    def overhead_beyond_cap(
        self, device: DeviceSnapshot, group_of: Mapping[int, int], caps: Mapping[int, int]
    ) -> int | None:
        """The most memory one of our trials holds beyond its cap; None when not seen.

        `group_of` maps our pids to their trial's process group, `caps` a group to its limit.
        """

    @abstractmethod
    def trial_memory_mb(
        self, device: DeviceSnapshot, pids: Collection[int], *, resident: ResidentMemory
    ) -> int | None:
        """Memory one trial (these processes) holds on the device now; None when unknown."""
