"""Device kinds: what each offers, how it caps a trial, how it accounts memory; and that a
third kind is one class that placement takes as it takes the two there are."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar, Literal

import pytest

from gpumux.devices.kinds import KINDS, kind_of
from gpumux.devices.kinds.base import (
    DeviceKind,
    PackingRules,
    ResidentMemory,
    TrialCap,
    TrialSetup,
)
from gpumux.devices.kinds.cpu import CpuKind
from gpumux.devices.kinds.gpu import GpuKind
from gpumux.devices.resident import resident_mb
from gpumux.devices.snapshot import DeviceSnapshot, GpuProcess, core_blocks
from gpumux.runtime import context
from gpumux.scheduling.placement import (
    PackingPolicy,
    PendingTrial,
    Placement,
    RunningTrial,
    never_fits,
    plan,
)

H100_MB = 81559
FOREIGN_PID = 424242
POLICY = PackingPolicy()


def place(**request: Any) -> list[Placement]:
    """What plan() places, in the queue's order."""
    return plan(**request).placements


BASE = DeviceSnapshot(
    key="gpu-0",
    kind="gpu",
    index=0,
    name="Test gpu",
    uuid=None,
    memory_total_mb=H100_MB,
    memory_used_mb=0,
    memory_free_mb=H100_MB,
    utilization_pct=0,
    processes=(),
    cpu_count=None,
)


def snapshot(kind: str, **fields: Any) -> DeviceSnapshot:
    return replace(BASE, **{"key": f"{kind}-0", "kind": kind, "name": f"Test {kind}", **fields})


def gpu(**fields: Any) -> DeviceSnapshot:
    return snapshot("gpu", **{"key": "GPU-0b5c", "uuid": "GPU-0b5c", **fields})


def cpu(**fields: Any) -> DeviceSnapshot:
    defaults = dict(
        key="cpu", memory_total_mb=16000, memory_free_mb=12000, processes=None, cpu_count=8
    )
    return snapshot("cpu", **{**defaults, **fields})


def test_each_kind_is_found_by_its_name_and_an_unknown_one_says_how_to_add_it() -> None:
    assert isinstance(kind_of(gpu()), GpuKind) and isinstance(kind_of(cpu()), CpuKind)
    with pytest.raises(ValueError, match=r"device mps-0: unknown kind 'mps' \(known: cpu, gpu\)"):
        kind_of(snapshot("mps"))


def test_a_gpu_offers_its_model_the_default_split_and_a_ceiling_by_memory() -> None:
    kind = GpuKind()
    assert kind.model_name(gpu()) == "Test gpu"
    assert kind.default_split(gpu(), PackingPolicy(default_split=3)) == 3
    room = H100_MB - 512
    ceiling = dict(reserve_mb=512, min_memory_mb=256, cpu_trial_mb=1024)
    assert kind.ceiling(gpu(), overhead_mb=1024, **ceiling) == room // 1280
    assert kind.ceiling(gpu(), overhead_mb=3000, **ceiling) == room // 3256
    assert kind.ceiling(gpu(memory_total_mb=None), overhead_mb=1024, **ceiling) == 1


def test_a_gpu_trial_sees_its_gpu_by_uuid_else_by_index() -> None:
    assert GpuKind().cuda_visible_devices(gpu()) == "GPU-0b5c"
    assert GpuKind().cuda_visible_devices(gpu(uuid=None, index=3)) == "3"


def test_a_gpu_cuts_equal_slices_of_what_others_leave() -> None:
    kind = GpuKind()
    crowded = gpu(processes=(GpuProcess(pid=FOREIGN_PID, used_memory_mb=30000),))
    room = kind.room_mb(crowded, reserve_mb=512, our_pids=(), our_caps=[], overhead_mb=1024)
    assert room == H100_MB - 512 - 30000
    cap = kind.cap(crowded, split=4, room_mb=room, held_mb=0, overhead_mb=1024, rules=POLICY)
    assert cap == TrialCap(memory_limit_mb=room // 4 - 1024, cpu_threads=None)
    full = room - 1000
    taken = kind.cap(crowded, split=4, room_mb=room, held_mb=full, overhead_mb=1024, rules=POLICY)
    assert taken is None, "the slice no longer fits beside what our trials hold"
    thin = kind.cap(gpu(), split=1000, room_mb=room, held_mb=0, overhead_mb=0, rules=POLICY)
    assert thin is None, "a slice under the smallest one"
    assert not kind.usable(gpu(memory_total_mb=None)) and not kind.usable(gpu(error="lost"))


THREADS = ("GPUMUX_CPU_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def host_gpus(cores: int, gpus: int) -> list[DeviceSnapshot]:
    """The GPUs of a host with `cores` cores as the probe gives them: each its block of cores."""
    return [
        gpu(key=f"GPU-{i}", uuid=f"GPU-{i}", index=i, cpu_count=len(block), cpu_cores=block)
        for i, block in enumerate(core_blocks(range(cores), gpus))
    ]


def gpu_trials(device: DeviceSnapshot, split: int, *, pin: bool) -> list[TrialSetup]:
    """What the `split` trials that fill the idle GPU start with, slot by slot."""
    kind = GpuKind()
    room = kind.room_mb(device, reserve_mb=512, our_pids=(), our_caps=[], overhead_mb=1024)
    setups = []
    for slot in range(split):
        cap = kind.cap(device, split=split, room_mb=room, held_mb=0, overhead_mb=1024, rules=POLICY)
        assert cap is not None
        setups.append(kind.trial_setup(device, slot=slot, cap=cap, pin=pin))
    return setups


@pytest.mark.parametrize("cores", [1, 2, 16, 64])
@pytest.mark.parametrize("gpus", [1, 2, 8])
@pytest.mark.parametrize("split", [1, 3, 13, 34])
def test_a_gpu_trial_gets_its_share_of_the_hosts_cores_as_threads(
    cores: int, gpus: int, split: int
) -> None:
    for device in host_gpus(cores, gpus):
        per_gpu = cores // gpus or cores
        threads = max(1, per_gpu // split)
        for setup in gpu_trials(device, split, pin=False):
            env = setup.env
            assert {name: env[name] for name in THREADS} == dict.fromkeys(THREADS, str(threads))
            assert env["CUDA_VISIBLE_DEVICES"] == device.uuid and env["GPUMUX_DEVICE_KIND"] == "gpu"
            assert int(env["GPUMUX_MEMORY_LIMIT_MB"]) > 0
            assert env["GPUMUX_DEVICE_MEMORY_MB"] == str(H100_MB)
            assert "GPUMUX_CPU_CORES" not in env and setup.cpu_affinity is None
        if split <= per_gpu and gpus <= cores:
            # The threads of every trial on the host add up to its cores at most.
            assert gpus * split * threads <= cores


@pytest.mark.parametrize(
    ("cores", "gpus", "split"), [(16, 1, 4), (16, 2, 3), (64, 8, 8), (2, 1, 2)]
)
def test_pinned_trials_get_disjoint_blocks_of_their_gpus_cores(
    cores: int, gpus: int, split: int
) -> None:
    pinned: list[tuple[int, ...]] = []
    for device in host_gpus(cores, gpus):
        assert device.cpu_cores is not None
        for setup in gpu_trials(device, split, pin=True):
            assert setup.cpu_affinity is not None
            assert set(setup.cpu_affinity) <= set(device.cpu_cores)
            assert len(setup.cpu_affinity) == int(setup.env["GPUMUX_CPU_THREADS"])
            assert setup.env["GPUMUX_CPU_CORES"] == ",".join(map(str, setup.cpu_affinity))
            pinned.append(setup.cpu_affinity)
    every = [core for block in pinned for core in block]
    assert len(every) == len(set(every)), pinned


def test_more_pinned_trials_than_cores_share_them_round_the_blocks() -> None:
    (device,) = host_gpus(4, 1)
    affinity = [setup.cpu_affinity for setup in gpu_trials(device, 6, pin=True)]
    assert affinity == [(0,), (1,), (2,), (3,), (0,), (1,)]


def test_a_gpu_whose_cores_are_unknown_leaves_the_threads_alone() -> None:
    (setup,) = gpu_trials(gpu(cpu_count=None, cpu_cores=None), 1, pin=True)
    assert not set(THREADS) & set(setup.env) and setup.cpu_affinity is None
    assert setup.env["GPUMUX_MEMORY_LIMIT_MB"]


def test_a_gpu_says_which_split_fits_when_one_never_does() -> None:
    kind = GpuKind()
    small = gpu(memory_total_mb=24576)
    reason = kind.never_fits(small, split=32, overhead_mb=1024, rules=POLICY)
    assert reason is not None and "use --split 18 or less" in reason
    assert kind.never_fits(small, split=18, overhead_mb=1024, rules=POLICY) is None
    assert kind.never_fits(gpu(memory_total_mb=None), split=64, overhead_mb=0, rules=POLICY) is None


def test_the_overhead_is_what_a_trial_group_holds_beyond_its_slice() -> None:
    device = gpu(
        processes=(
            GpuProcess(pid=100, used_memory_mb=4096 + 500),  # trial A's leader
            GpuProcess(pid=101, used_memory_mb=300),  # a worker of trial A
            GpuProcess(pid=200, used_memory_mb=8192 + 650),  # trial B
            GpuProcess(pid=300, used_memory_mb=1000),  # a trial still below its slice
            GpuProcess(pid=FOREIGN_PID, used_memory_mb=30000),  # not ours
        )
    )
    group_of = {100: 100, 101: 100, 200: 200, 300: 300}
    caps = {100: 4096, 200: 8192, 300: 4096}
    assert GpuKind().overhead_beyond_cap(device, group_of, caps) == 800


def test_no_overhead_is_measured_before_a_trial_passes_its_slice() -> None:
    device = gpu(processes=(GpuProcess(pid=100, used_memory_mb=1000),))
    assert GpuKind().overhead_beyond_cap(device, {100: 100}, {100: 4096}) is None
    assert GpuKind().overhead_beyond_cap(gpu(processes=None), {100: 100}, {100: 4096}) is None
    assert CpuKind().overhead_beyond_cap(cpu(), {}, {}) is None


def test_a_gpu_trial_holds_what_nvml_lists_for_its_processes() -> None:
    device = gpu(
        processes=(
            GpuProcess(pid=100, used_memory_mb=4000),
            GpuProcess(pid=101, used_memory_mb=300),
            GpuProcess(pid=102, used_memory_mb=None),
            GpuProcess(pid=FOREIGN_PID, used_memory_mb=30000),
        )
    )
    assert GpuKind().trial_memory_mb(device, [100, 101, 102], resident=resident_mb) == 4300
    assert GpuKind().trial_memory_mb(device, [7], resident=resident_mb) is None


def test_the_cpu_offers_its_model_with_cores_and_a_ceiling_of_two_per_core() -> None:
    kind = CpuKind()
    assert kind.model_name(cpu()) == "Test cpu, 8 cores"
    assert kind.default_split(cpu(), POLICY) == 8
    assert kind.default_split(cpu(), PackingPolicy(cpu_default_split=3)) == 3
    ceiling = dict(reserve_mb=512, min_memory_mb=256, overhead_mb=1024)
    assert kind.ceiling(cpu(memory_free_mb=64000), cpu_trial_mb=1024, **ceiling) == 16
    assert kind.ceiling(cpu(memory_free_mb=5000), cpu_trial_mb=1024, **ceiling) == 4
    assert kind.ceiling(cpu(memory_free_mb=None), cpu_trial_mb=1024, **ceiling) == 1


def test_a_cpu_trial_gets_threads_not_memory_and_no_gpu() -> None:
    kind = CpuKind()
    assert kind.cap(cpu(), split=3, room_mb=0, held_mb=0, overhead_mb=0, rules=POLICY) == (
        TrialCap(memory_limit_mb=None, cpu_threads=2)
    )
    crowded = kind.cap(cpu(cpu_count=2), split=5, room_mb=0, held_mb=0, overhead_mb=0, rules=POLICY)
    assert crowded == TrialCap(memory_limit_mb=None, cpu_threads=1)
    assert kind.cuda_visible_devices(cpu()) == ""
    assert kind.never_fits(cpu(), split=64, overhead_mb=1024, rules=POLICY) is None


def test_a_cpu_trial_holds_its_processes_resident_memory() -> None:
    mine = CpuKind().trial_memory_mb(cpu(), [os.getpid()], resident=resident_mb)
    assert mine is not None and mine == pytest.approx(resident_mb([os.getpid()]), abs=2)


class RackKind(DeviceKind):
    """A test-only kind: fixed 1000 MB bays of the device's memory, one thread each."""

    name: ClassVar[str] = "rack"
    shared_by: ClassVar[str] = "bays"
    framework_device: ClassVar[Literal["cuda", "cpu"]] = "cuda"
    lists_processes: ClassVar[bool] = False
    BAY_MB: ClassVar[int] = 1000

    def model_name(self, device: DeviceSnapshot) -> str:
        return f"rack {device.name}"

    def default_split(self, device: DeviceSnapshot, rules: PackingRules) -> int:
        return 3

    def ceiling(
        self,
        device: DeviceSnapshot,
        *,
        reserve_mb: int,
        min_memory_mb: int,
        overhead_mb: int,
        cpu_trial_mb: int,
    ) -> int:
        return max(1, (device.memory_total_mb or 0) // self.BAY_MB)

    def room_mb(
        self,
        device: DeviceSnapshot,
        *,
        reserve_mb: int,
        our_pids: Collection[int],
        our_caps: Sequence[int | None],
        overhead_mb: int,
    ) -> int:
        return device.memory_total_mb or 0

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
        if held_mb + self.BAY_MB + overhead_mb > room_mb:
            return None
        return TrialCap(memory_limit_mb=self.BAY_MB, cpu_threads=1)

    def never_fits(
        self, device: DeviceSnapshot, *, split: int, overhead_mb: int, rules: PackingRules
    ) -> str | None:
        if (device.memory_total_mb or 0) >= self.BAY_MB + overhead_mb:
            return None
        return f"{device.name} has no room for one bay"

    def cuda_visible_devices(self, device: DeviceSnapshot) -> str:
        return f"rack-{device.index}"

    def overhead_beyond_cap(
        self, device: DeviceSnapshot, group_of: Mapping[int, int], caps: Mapping[int, int]
    ) -> int | None:
        return None

    def trial_memory_mb(
        self, device: DeviceSnapshot, pids: Collection[int], *, resident: ResidentMemory
    ) -> int | None:
        return resident(pids)


def test_a_third_kind_is_one_class_that_placement_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(KINDS, RackKind.name, RackKind())
    rack = snapshot("rack", key="rack-0", memory_total_mb=2600, processes=None)
    policy = PackingPolicy(overhead_mb=200)
    pending = [PendingTrial(trial_id=n, split=None) for n in range(1, 5)]
    placed = place(devices=[rack], running=[], pending=pending, policy=policy)
    # Three bays by default, but 2600 MB hold two bays of 1000 MB and their 200 MB overhead.
    assert placed == [
        Placement(trial_id=1, device_key="rack-0", slot=0, split=3, memory_limit_mb=1000,
                  cpu_threads=1),
        Placement(trial_id=2, device_key="rack-0", slot=1, split=3, memory_limit_mb=1000,
                  cpu_threads=1),
    ]  # fmt: skip
    beside = place(devices=[rack, cpu()], running=[], pending=pending, policy=policy)
    assert {p.device_key for p in beside} == {"cpu"}, "the CPU's 8 free slots rank first"
    running = [RunningTrial(trial_id=9, device_key="rack-0", slot=0, split=3, memory_limit_mb=1000)]
    again = place(devices=[rack], running=running, pending=pending[:2], policy=policy)
    assert [(p.trial_id, p.slot) for p in again] == [(1, 1)]
    tiny = snapshot("rack", key="rack-1", name="tiny rack", memory_total_mb=900)
    assert never_fits(PendingTrial(trial_id=1, split=2), [tiny], policy) == (
        "tiny rack has no room for one bay"
    )
    assert kind_of(rack).cuda_visible_devices(rack) == "rack-0"
    # Its trials' environment comes from the interface, its device and its cap in it.
    cap = TrialCap(memory_limit_mb=1000, cpu_threads=1)
    env = kind_of(rack).trial_setup(rack, slot=1, cap=cap, pin=False).env
    assert (env["GPUMUX_DEVICE_KIND"], env["CUDA_VISIBLE_DEVICES"]) == ("rack", "rack-0")
    assert env["GPUMUX_FRAMEWORK_DEVICE"] == "cuda", "its frameworks are capped as on a GPU"
    assert (env["GPUMUX_MEMORY_LIMIT_MB"], env["OMP_NUM_THREADS"]) == ("1000", "1")


class SharedGpuKind(GpuKind):
    """A test-only kind that CUDA sees as a GPU (as MPS or a MIG instance would be): only its
    name differs from the GPU's."""

    name: ClassVar[str] = "shared-gpu"


def test_a_kind_the_frameworks_see_as_a_gpu_caps_its_trials_as_on_a_gpu_by_its_class_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(KINDS, SharedGpuKind.name, SharedGpuKind())
    device = snapshot(SharedGpuKind.name, key="shared-gpu-0")
    cap = TrialCap(memory_limit_mb=4096, cpu_threads=2)
    env = kind_of(device).trial_setup(device, slot=0, cap=cap, pin=False).env
    trial = context.current({"GPUMUX_TRIAL_ID": "1", **env})
    assert trial is not None
    # The trial's runtime knows no kind by name: it caps CUDA's memory because the kind says so.
    assert env["GPUMUX_DEVICE_KIND"] == "shared-gpu" and trial.on_gpu
    assert (trial.memory_limit_mb, trial.cpu_threads) == (4096, 2)
    assert kind_of(device).work_cores(device) is None, "gpumux tune overlaps its rounds"
    cpu_env = kind_of(cpu()).trial_setup(cpu(), slot=0, cap=cap, pin=False).env
    cpu_trial = context.current({"GPUMUX_TRIAL_ID": "1", **cpu_env})
    assert cpu_trial is not None and not cpu_trial.on_gpu


STEPS = (1, 2, 3, 5, 8, 13, 21, 34)


def test_a_gpu_search_starts_at_a_quarter_of_what_the_smallest_slices_allow() -> None:
    kind = GpuKind()
    assert kind.first_split(gpu(), 62, steps=STEPS, cores=64).split == 13
    assert kind.first_split(gpu(), 12, steps=STEPS, cores=64).split == 3
    assert kind.first_split(gpu(), 3, steps=STEPS, cores=64).split == 1, "a small card starts alone"


def test_a_gpu_guess_from_memory_first_runs_half_of_it_and_one_from_the_cores_does_not() -> None:
    kind = GpuKind()
    # Memory's guess assumes what a trial holds: a wave of half of it shows what one does.
    assert kind.first_split(gpu(), 62, steps=STEPS, cores=64).probe == 6
    assert kind.first_split(gpu(), 12, steps=STEPS, cores=64).probe == 1
    assert kind.first_split(gpu(), 3, steps=STEPS, cores=64).probe is None, "nothing below 1"
    assert kind.first_split(gpu(), 400, steps=STEPS, cores=16).probe is None


def test_a_gpu_search_starts_at_no_more_trials_than_the_host_has_cores() -> None:
    kind = GpuKind()
    # The H200 measured: its ceiling allowed 13 at a quarter, its host had 16 cores.
    big = kind.first_split(gpu(), 400, steps=STEPS, cores=16)
    small_host = kind.first_split(gpu(), 62, steps=STEPS, cores=2)

    assert (big.split, big.why) == (16, "the host's 16 cores")
    assert small_host.split == 2


def test_once_memory_is_known_a_gpu_search_starts_at_the_step_below_the_fit_within_the_cores() -> (
    None
):
    kind = GpuKind()
    # A first wave showed 28 fit on a host of 32 cores: the step below the fit, which the
    # wave's early reading may understate; the cores bound it where fewer.
    fit = kind.known_split(28, steps=STEPS, cores=32)
    assert (fit.split, fit.why) == (
        21,
        "the step below the 28 trials memory allows, within 32 cores",
    )
    assert kind.known_split(28, steps=STEPS, cores=8).split == 8
    assert kind.known_split(8, steps=STEPS, cores=16).split == 5, "below a fit on a step"
    assert kind.known_split(1, steps=STEPS, cores=16).split == 1


def test_a_cpu_search_starts_at_its_cores_and_only_a_gpu_ceiling_is_worth_keeping() -> None:
    kind = CpuKind()
    assert kind.first_split(cpu(cpu_count=6), 12, steps=STEPS, cores=6).split == 6
    assert kind.first_split(cpu(cpu_count=6), 4, steps=STEPS, cores=6).split == 4, "the ceiling"
    assert not CpuKind.stable_ceiling and GpuKind.stable_ceiling
