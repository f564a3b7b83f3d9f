from __future__ import annotations

from collections import Counter
from dataclasses import replace
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumux.devices.kinds import kind_of
from gpumux.devices.kinds.gpu import foreign_memory_mb
from gpumux.devices.snapshot import DeviceSnapshot, GpuProcess
from gpumux.scheduling.placement import (
    PackingPolicy,
    PendingTrial,
    Placement,
    RunningTrial,
    expected_split,
    never_fits,
    plan,
)

H100_MB = 81559
POLICY = PackingPolicy()
USABLE = H100_MB - POLICY.reserve_mb
FOREIGN_PID = 424242
# The sweeps of drawn trials (None: a trial placed before sweeps were known).
SWEEPS = st.none() | st.integers(1, 3)


def place(**request: Any) -> list[Placement]:
    """What plan() places, in the queue's order."""
    return plan(**request).placements


def gpu(
    index: int = 0,
    *,
    total: int | None = H100_MB,
    used: int | None = 0,
    processes: tuple[GpuProcess, ...] | None = (),
    error: str | None = None,
) -> DeviceSnapshot:
    return DeviceSnapshot(
        key=f"GPU-{index}",
        kind="gpu",
        index=index,
        name="NVIDIA H100 80GB HBM3",
        uuid=f"GPU-{index}",
        memory_total_mb=total,
        memory_used_mb=used,
        memory_free_mb=None if total is None or used is None else total - used,
        utilization_pct=0,
        processes=processes,
        cpu_count=None,
        error=error,
    )


def cpu(count: int | None = 8) -> DeviceSnapshot:
    return DeviceSnapshot(
        key="cpu",
        kind="cpu",
        index=0,
        name="Test CPU",
        uuid=None,
        memory_total_mb=16000,
        memory_used_mb=4000,
        memory_free_mb=12000,
        utilization_pct=None,
        processes=None,
        cpu_count=count,
    )


def queue(count: int, split: int | None = None, first_id: int = 1) -> list[PendingTrial]:
    return [PendingTrial(trial_id=first_id + i, split=split) for i in range(count)]


def running_on(key: str, slots: list[int], cap: int | None, split: int = 4) -> list[RunningTrial]:
    return [
        RunningTrial(
            trial_id=100 + slot, device_key=key, slot=slot, memory_limit_mb=cap, split=split
        )
        for slot in slots
    ]


def test_one_gpu_split_four_gets_four_equal_slices() -> None:
    placed = place(devices=[gpu()], running=[], pending=queue(6, split=4), policy=POLICY)
    cap = USABLE // 4 - POLICY.overhead_mb
    assert placed == [
        Placement(
            trial_id=i + 1,
            device_key="GPU-0",
            slot=i,
            split=4,
            memory_limit_mb=cap,
            cpu_threads=None,
        )
        for i in range(4)
    ]
    assert cap == 19237


def test_default_split_applies_when_the_sweep_fixes_none() -> None:
    placed = place(devices=[gpu()], running=[], pending=queue(3), policy=POLICY)
    assert [(p.split, p.memory_limit_mb) for p in placed] == [(2, USABLE // 2 - 1024)] * 2


def test_foreign_memory_shrinks_caps() -> None:
    device = gpu(processes=(GpuProcess(pid=FOREIGN_PID, used_memory_mb=30000),), used=30522)
    placed = place(devices=[device], running=[], pending=queue(4, split=4), policy=POLICY)
    assert {p.memory_limit_mb for p in placed} == {(USABLE - 30000) // 4 - 1024}
    ours = place(
        devices=[device],
        running=[],
        pending=queue(4, split=4),
        policy=POLICY,
        our_pids={FOREIGN_PID},
    )
    assert {p.memory_limit_mb for p in ours} == {USABLE // 4 - 1024}


def test_foreign_memory_lowers_the_split_that_fits() -> None:
    crowded = gpu(processes=(GpuProcess(pid=FOREIGN_PID, used_memory_mb=60000),))
    assert len(place(devices=[gpu()], running=[], pending=queue(32, 32), policy=POLICY)) == 32
    assert place(devices=[crowded], running=[], pending=queue(32, 32), policy=POLICY) == []
    assert len(place(devices=[crowded], running=[], pending=queue(8, 8), policy=POLICY)) == 8


def test_slices_below_the_minimum_are_not_launched() -> None:
    policy = PackingPolicy(min_memory_mb=USABLE // 4 - 1024 + 1)
    assert place(devices=[gpu()], running=[], pending=queue(4, 4), policy=policy) == []
    assert len(place(devices=[gpu()], running=[], pending=queue(4, 2), policy=policy)) == 2


def test_memory_exhaustion_stops_packing() -> None:
    running = running_on("GPU-0", [0], cap=40000)
    placed = place(devices=[gpu()], running=running, pending=queue(4, 4), policy=POLICY)
    assert [p.slot for p in placed] == [1]
    held = sum(p.memory_limit_mb or 0 for p in placed) + 40000 + 2 * POLICY.overhead_mb
    assert held <= USABLE


def test_running_trials_count_against_the_split() -> None:
    running = running_on("GPU-0", [0, 2], cap=19237)
    placed = place(devices=[gpu()], running=running, pending=queue(4, 4), policy=POLICY)
    assert [(p.trial_id, p.slot) for p in placed] == [(1, 1), (2, 3)]


def test_a_raised_n_frees_its_slot_for_the_same_sweep_only() -> None:
    # Sweep 7's trial runs under N=1 on the CPU; its search has since raised N to 2.
    running = running_on("cpu", [0], cap=None, split=1)
    credit = {("cpu", 7): Fraction(1, 1) - Fraction(1, 2)}
    own = PendingTrial(trial_id=1, split=None, tuned={"cpu": 2}, sweep_id=7)
    other = PendingTrial(trial_id=2, split=None, tuned={"cpu": 2}, sweep_id=8)
    request = dict(devices=[cpu()], running=running, policy=POLICY, credits=credit)
    (placed,) = place(pending=[own], **request)
    assert (placed.trial_id, placed.slot, placed.split) == (1, 1, 2)
    assert place(pending=[other], **request) == []
    # The credit is the slot N opened, not more: a second trial of the sweep waits.
    second = replace(own, trial_id=3)
    assert [p.trial_id for p in place(pending=[own, second], **request)] == [1]
    # On a GPU the trial of the lower N still holds the memory its cap gave it.
    whole = running_on("GPU-0", [0], cap=USABLE, split=1)
    gpu_credit = {("GPU-0", 7): Fraction(1, 2)}
    on_gpu = replace(own, tuned={"GPU-0": 2})
    assert (
        place(devices=[gpu()], running=whole, pending=[on_gpu], policy=POLICY, credits=gpu_credit)
        == []
    )


def test_a_slot_is_reused_after_its_trial_leaves() -> None:
    full = running_on("GPU-0", [0, 1, 2, 3], cap=19237)
    assert place(devices=[gpu()], running=full, pending=queue(1, 4), policy=POLICY) == []
    left = [t for t in full if t.slot != 1]
    placed = place(devices=[gpu()], running=left, pending=queue(1, 4), policy=POLICY)
    assert [(p.slot, p.memory_limit_mb) for p in placed] == [(1, 19237)]


def test_a_stopped_trials_slot_is_free_only_once_nvml_shows_its_memory_released() -> None:
    # Slot 1's trial was pruned: it is no longer ours, but NVML still lists its process with
    # its slice; the next trial gets the slot only once that memory is gone.
    others = [t for t in running_on("GPU-0", [0, 1, 2, 3], cap=19237) if t.slot != 1]
    ours = (71, 72, 73)
    held = tuple(GpuProcess(pid=pid, used_memory_mb=20261) for pid in ours)
    lingering = gpu(processes=(*held, GpuProcess(pid=74, used_memory_mb=20261)), used=81044)
    pending = queue(1, 4)
    assert (
        place(devices=[lingering], running=others, pending=pending, policy=POLICY, our_pids=ours)
        == []
    )
    released = gpu(processes=held, used=60783)
    placed = place(
        devices=[released], running=others, pending=pending, policy=POLICY, our_pids=ours
    )
    assert [(p.slot, p.memory_limit_mb) for p in placed] == [(1, 19237)]


def test_two_gpus_are_both_filled() -> None:
    placed = place(devices=[gpu(0), gpu(1)], running=[], pending=queue(5, 2), policy=POLICY)
    assert [(p.device_key, p.slot) for p in placed] == [
        ("GPU-0", 0),
        ("GPU-1", 0),
        ("GPU-0", 1),
        ("GPU-1", 1),
    ]


def test_the_device_with_most_free_slots_goes_first() -> None:
    running = running_on("GPU-0", [0], cap=19237)
    placed = place(devices=[gpu(0), gpu(1)], running=running, pending=queue(2, 4), policy=POLICY)
    # Then both have three free slots: the tie goes to the lower index.
    assert [p.device_key for p in placed] == ["GPU-1", "GPU-0"]


def test_failing_or_unmeasured_gpus_are_skipped() -> None:
    devices = [gpu(0, error="GPU is lost"), gpu(1), gpu(2, total=None)]
    placed = place(devices=devices, running=[], pending=queue(4, 2), policy=POLICY)
    assert [p.device_key for p in placed] == ["GPU-1", "GPU-1"]
    unusable = [gpu(0, error="GPU is lost"), gpu(2, total=None)]
    assert place(devices=unusable, running=[], pending=queue(1), policy=POLICY) == []


def test_cpu_threads_divide_the_cores() -> None:
    placed = place(devices=[cpu(8)], running=[], pending=queue(5, 4), policy=POLICY)
    assert [(p.device_key, p.slot, p.cpu_threads, p.memory_limit_mb) for p in placed] == [
        ("cpu", slot, 2, None) for slot in range(4)
    ]
    by_default = place(devices=[cpu(8)], running=[], pending=queue(9), policy=POLICY)
    assert [(p.split, p.cpu_threads) for p in by_default] == [(8, 1)] * 8
    policy = PackingPolicy(cpu_default_split=2)
    configured = place(devices=[cpu(8)], running=[], pending=queue(3), policy=policy)
    assert [(p.split, p.cpu_threads) for p in configured] == [(2, 4)] * 2
    crowded = place(devices=[cpu(2)], running=[], pending=queue(3, 3), policy=POLICY)
    assert [p.cpu_threads for p in crowded] == [1, 1, 1]


def test_strict_fifo_stops_at_the_first_trial_that_fits_nowhere() -> None:
    running = running_on("GPU-0", [0], cap=19237)
    pending = [PendingTrial(trial_id=1, split=1), *queue(3, split=4, first_id=2)]
    assert place(devices=[gpu()], running=running, pending=pending, policy=POLICY) == []
    placed = place(devices=[gpu()], running=[], pending=pending, policy=POLICY)
    assert [p.trial_id for p in placed] == [1]


def test_measured_overhead_overrides_the_default() -> None:
    policy = PackingPolicy(overhead_by_device={"GPU-0": 2048})
    placed = place(devices=[gpu(0), gpu(1)], running=[], pending=queue(2, 2), policy=policy)
    assert {p.device_key: p.memory_limit_mb for p in placed} == {
        "GPU-0": USABLE // 2 - 2048,
        "GPU-1": USABLE // 2 - 1024,
    }


def test_foreign_memory_from_the_process_list() -> None:
    measured = (GpuProcess(pid=1, used_memory_mb=5000), GpuProcess(pid=2, used_memory_mb=700))
    device = gpu(processes=(*measured, GpuProcess(pid=3, used_memory_mb=None)), used=9000)
    assert foreign_memory_mb(device, {1}, [], 1024) == 9000, "pid 3's memory is unknown"
    known = gpu(processes=measured, used=9000)
    assert foreign_memory_mb(known, {1}, [], 1024) == 700


def test_foreign_memory_without_a_process_list() -> None:
    caps = [t.memory_limit_mb for t in running_on("GPU-0", [0, 1], cap=19237)]
    assert foreign_memory_mb(gpu(processes=None, used=50000), (), caps, 1024) == 9478
    assert foreign_memory_mb(gpu(processes=None, used=1000), (), caps, 1024) == 0
    assert foreign_memory_mb(gpu(processes=None, used=None), (), caps, 1024) == 0


def test_splits_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="trial 7: split must be at least 1"):
        PendingTrial(trial_id=7, split=0)
    with pytest.raises(ValueError, match="default_split"):
        PackingPolicy(default_split=0)
    with pytest.raises(ValueError, match="cpu_default_split"):
        PackingPolicy(cpu_default_split=0)


@st.composite
def scenarios(
    draw: st.DrawFn,
) -> tuple[list[DeviceSnapshot], list[RunningTrial], list[PendingTrial], PackingPolicy, set[int]]:
    memory = st.integers(0, 100_000)
    devices = []
    for index in range(draw(st.integers(0, 3))):
        processes = st.lists(
            st.builds(GpuProcess, pid=st.integers(1, 12), used_memory_mb=st.none() | memory),
            max_size=4,
        ).map(tuple)
        devices.append(
            gpu(
                index,
                total=draw(st.none() | memory),
                used=draw(st.none() | memory),
                processes=draw(st.none() | processes),
                error=draw(st.none() | st.just("GPU is lost")),
            )
        )
    if draw(st.booleans()):
        devices.append(cpu(draw(st.none() | st.integers(1, 64))))
    running: list[RunningTrial] = []
    for device in devices:
        for slot in draw(st.sets(st.integers(0, 9), max_size=5)):
            cap = draw(st.none() | st.integers(0, 40_000))
            split = draw(st.integers(1, 12))
            sweep_id = draw(SWEEPS)
            running.append(
                RunningTrial(len(running) + 1, device.key, slot, cap, split, sweep_id=sweep_id)
            )
    splits = st.none() | st.integers(1, 12)
    pending = [
        PendingTrial(1000 + i, draw(splits), sweep_id=draw(SWEEPS))
        for i in range(draw(st.integers(0, 30)))
    ]
    policy = PackingPolicy(
        default_split=draw(st.integers(1, 8)),
        cpu_default_split=draw(st.none() | st.integers(1, 8)),
        overhead_mb=draw(st.integers(0, 4000)),
        overhead_by_device=draw(st.dictionaries(st.just("GPU-0"), st.integers(0, 4000))),
        context_by_sweep=draw(
            st.dictionaries(
                st.tuples(st.sampled_from(["GPU-0", "GPU-1"]), st.integers(1, 3)),
                st.integers(0, 1500),
            )
        ),
        reserve_mb=draw(st.integers(0, 2000)),
        min_memory_mb=draw(st.integers(1, 4000)),
    )
    return devices, running, pending, policy, draw(st.sets(st.integers(1, 12)))


@settings(deadline=None)
@given(scenarios())
def test_placement_invariants(
    scenario: tuple[
        list[DeviceSnapshot], list[RunningTrial], list[PendingTrial], PackingPolicy, set[int]
    ],
) -> None:
    devices, running, pending, policy, our_pids = scenario
    placed = place(
        devices=devices, running=running, pending=pending, policy=policy, our_pids=our_pids
    )
    # Placed in the queue's order, each trial once; with one usable device, strict FIFO.
    order = [t.trial_id for t in pending]
    placed_ids = [p.trial_id for p in placed]
    assert placed_ids == sorted(placed_ids, key=order.index)
    assert len(set(placed_ids)) == len(placed_ids)
    if sum(kind_of(d).usable(d) for d in devices) < 2:
        assert placed_ids == order[: len(placed)]
    by_key = {d.key: d for d in devices}
    by_id = {t.trial_id: t for t in pending}
    shares = {
        key: sum(Fraction(1, t.split) for t in running if t.device_key == key) for key in by_key
    }
    slots = {key: {t.slot for t in running if t.device_key == key} for key in by_key}
    for placement in placed:
        trial = by_id[placement.trial_id]
        device = by_key[placement.device_key]
        assert device.error is None
        # Shares, not counts: the running trials' 1/split and the new ones' never pass 1.
        shares[device.key] += Fraction(1, placement.split)
        assert shares[device.key] <= 1
        assert placement.slot == min(set(range(len(slots[device.key]) + 1)) - slots[device.key])
        slots[device.key].add(placement.slot)
        if device.kind == "cpu":
            count = device.cpu_count or 1
            assert placement.split == (trial.split or policy.cpu_default_split or count)
            assert placement.memory_limit_mb is None
            assert placement.cpu_threads == max(1, count // placement.split)
        else:
            assert placement.split == (trial.split or policy.default_split)
            assert placement.cpu_threads is None
            assert placement.memory_limit_mb is not None
            assert placement.memory_limit_mb >= policy.min_memory_mb
    for device in devices:
        new = [p for p in placed if p.device_key == device.key]
        if device.kind != "gpu" or not new:
            continue
        mine = [t for t in running if t.device_key == device.key]
        assert device.memory_total_mb is not None
        caps = [t.memory_limit_mb for t in mine]
        usable = (
            device.memory_total_mb
            - policy.reserve_mb
            - foreign_memory_mb(device, our_pids, caps, policy.overhead_for(device.key))
        )
        # Each trial with the overhead of its own sweep's workload beside its cap.
        held = sum(
            (t.memory_limit_mb or 0) + policy.overhead_for(device.key, t.sweep_id) for t in mine
        )
        held += sum(
            (p.memory_limit_mb or 0) + policy.overhead_for(device.key, by_id[p.trial_id].sweep_id)
            for p in new
        )
        assert held <= usable


def test_a_measured_overhead_replaces_the_configured_one_in_the_budget() -> None:
    pending = [PendingTrial(trial_id=n, split=8) for n in range(8)]
    configured = place(devices=[gpu()], running=[], pending=pending, policy=POLICY)
    measured = place(
        devices=[gpu()],
        running=[],
        pending=pending,
        policy=PackingPolicy(overhead_by_device={"GPU-0": 600}),
    )
    assert configured[0].memory_limit_mb == USABLE // 8 - POLICY.overhead_mb
    assert measured[0].memory_limit_mb == USABLE // 8 - 600


def test_a_sweeps_measured_context_is_the_overhead_of_its_own_trials_alone() -> None:
    policy = PackingPolicy(context_by_sweep={("GPU-0", 1): 300})
    pending = [PendingTrial(1, split=4, sweep_id=1), PendingTrial(2, split=4, sweep_id=2)]
    placed = place(devices=[gpu()], running=[], pending=pending, policy=policy)
    assert [p.memory_limit_mb for p in placed] == [USABLE // 4 - 300, USABLE // 4 - 1024]
    # Three of its trials running, the fourth fits beside them: each holds its context.
    running = [RunningTrial(n, "GPU-0", n, USABLE // 4 - 300, 4, sweep_id=1) for n in range(3)]
    fourth = [PendingTrial(9, split=4, sweep_id=1)]
    placed = place(devices=[gpu()], running=running, pending=fourth, policy=policy)
    assert [p.memory_limit_mb for p in placed] == [USABLE // 4 - 300]
    # The same trials of a sweep whose context is not known hold the configured overhead.
    others = [replace(t, sweep_id=2) for t in running]
    assert place(devices=[gpu()], running=others, pending=fourth, policy=policy) == []


def test_a_split_that_fits_no_device_even_empty_says_why_and_what_would() -> None:
    small = gpu(total=24576)
    reason = never_fits(PendingTrial(trial_id=1, split=32), [small], POLICY)
    assert reason is not None
    assert "split 32 leaves -272 MB per trial" in reason
    assert "use --split 18 or less" in reason
    assert never_fits(PendingTrial(trial_id=1, split=18), [small], POLICY) is None
    assert never_fits(PendingTrial(trial_id=1, split=32), [small, cpu()], POLICY) is None
    assert never_fits(PendingTrial(trial_id=1, split=None), [small], POLICY) is None


def test_a_foreign_process_of_unknown_memory_is_not_counted_as_zero() -> None:
    device = gpu(
        used=30_000 + 4096 + POLICY.overhead_mb,
        processes=(
            GpuProcess(pid=FOREIGN_PID, used_memory_mb=None),
            GpuProcess(pid=7, used_memory_mb=5000),
        ),
    )
    assert foreign_memory_mb(device, {7}, [4096], POLICY.overhead_mb) == 30_000


def test_a_tuned_split_applies_on_its_device_only() -> None:
    pending = [PendingTrial(trial_id=n, split=None, tuned={"GPU-1": 3}) for n in range(6)]
    plan = place(devices=[gpu(0), gpu(1)], running=[], pending=pending, policy=POLICY)
    by_device = Counter(p.device_key for p in plan)
    assert by_device == {"GPU-1": 3, "GPU-0": POLICY.default_split}
    assert {p.split for p in plan if p.device_key == "GPU-1"} == {3}


def test_a_mixed_device_is_packed_by_each_trials_share() -> None:
    # Two trials of a workload at N=4 hold half the CPU: a workload at N=2 fits once, not twice.
    running = running_on("cpu", [0, 1], cap=None, split=4)
    pending = [PendingTrial(trial_id=1, split=2), PendingTrial(trial_id=2, split=2)]
    placed = place(devices=[cpu(8)], running=running, pending=pending, policy=POLICY)
    assert [(p.trial_id, p.slot, p.split, p.cpu_threads) for p in placed] == [(1, 2, 2, 4)]
    # The share left by one N=2 and one N=4 trial holds one more N=4 trial, not an N=3 one.
    half = [RunningTrial(1, "cpu", 0, None, split=2), RunningTrial(2, "cpu", 1, None, split=4)]
    assert place(devices=[cpu(8)], running=half, pending=queue(1, 3), policy=POLICY) == []
    (quarter,) = place(devices=[cpu(8)], running=half, pending=queue(2, 4), policy=POLICY)
    assert (quarter.slot, quarter.split) == (2, 4)


def test_shares_are_exact_fractions() -> None:
    # Three thirds fill a device exactly; floats would leave 1/3 + 1/3 + 1/3 a hair from 1.
    thirds = [RunningTrial(n, "cpu", n, None, split=3) for n in range(2)]
    (last,) = place(devices=[cpu(6)], running=thirds, pending=queue(2, 3), policy=POLICY)
    assert last.slot == 2
    tenths = [RunningTrial(n, "cpu", n, None, split=10) for n in range(7)]
    placed = place(devices=[cpu(10)], running=tenths, pending=queue(4, 10), policy=POLICY)
    assert [p.slot for p in placed] == [7, 8, 9]


def test_the_head_reserves_the_device_where_it_fits_soonest_and_others_pass_elsewhere() -> None:
    # GPU-0 has half of its share free, GPU-1 a quarter: the head (N=1) fits on neither, and
    # reserves GPU-0, which frees sooner; the N=4 trials behind it go to GPU-1 only.
    running = [
        *running_on("GPU-0", [0, 1], cap=19237),
        *running_on("GPU-1", [0, 1, 2], cap=19237),
    ]
    pending = [PendingTrial(trial_id=1, split=1), *queue(3, split=4, first_id=2)]
    placed = place(devices=[gpu(0), gpu(1)], running=running, pending=pending, policy=POLICY)
    assert [(p.trial_id, p.device_key, p.slot) for p in placed] == [(2, "GPU-1", 3)]
    # Once GPU-0 is empty, the head is placed there first.
    emptied = running_on("GPU-1", [0, 1, 2], cap=19237)
    placed = place(devices=[gpu(0), gpu(1)], running=emptied, pending=pending, policy=POLICY)
    assert [(p.trial_id, p.device_key) for p in placed] == [(1, "GPU-0"), (2, "GPU-1")]


def test_every_device_reserved_places_nothing_more() -> None:
    running = [*running_on("GPU-0", [0], cap=19237), *running_on("GPU-1", [0], cap=19237)]
    pending = [
        PendingTrial(trial_id=1, split=1),
        PendingTrial(trial_id=2, split=1),
        *queue(4, split=4, first_id=3),
    ]
    assert place(devices=[gpu(0), gpu(1)], running=running, pending=pending, policy=POLICY) == []


def test_the_split_fair_share_expects_is_the_sweeps_else_the_first_usable_devices() -> None:
    broken, devices = gpu(0, error="lost"), [gpu(0, error="lost"), gpu(1), cpu(8)]
    tuned = {"GPU-0": 7, "GPU-1": 5}
    assert expected_split(PendingTrial(1, split=3, tuned=tuned), devices, POLICY) == 3
    assert expected_split(PendingTrial(1, split=None, tuned=tuned), devices, POLICY) == 5
    assert expected_split(PendingTrial(1, split=None), devices, POLICY) == POLICY.default_split
    assert expected_split(PendingTrial(1, split=None), [broken, cpu(8)], POLICY) == 8
    assert expected_split(PendingTrial(1, split=None), [broken], POLICY) == POLICY.default_split


def test_the_head_reserves_a_device_it_waits_on_for_share_before_one_it_lacks_memory_on() -> None:
    # GPU-0 has three quarters of its share free, but another process took 50 GB there since our
    # trial started: the head (N=2) fits by share, not in the memory left. GPU-1 frees a quarter
    # of its share before the head fits: the head reserves GPU-1, and the N=4 trial behind it,
    # small enough for GPU-0's memory, goes there.
    ours = GpuProcess(pid=71, used_memory_mb=20261)
    crowded = gpu(0, processes=(GpuProcess(pid=FOREIGN_PID, used_memory_mb=50000), ours))
    crowded = replace(crowded, memory_used_mb=70261, memory_free_mb=H100_MB - 70261)
    running = [*running_on("GPU-0", [0], cap=19237), *running_on("GPU-1", [0, 1, 2], cap=19237)]
    pending = [PendingTrial(trial_id=1, split=2), PendingTrial(trial_id=2, split=4)]
    made = plan(
        devices=[crowded, gpu(1)], running=running, pending=pending, policy=POLICY, our_pids={71}
    )
    assert made.reserved == {"GPU-1": 1}
    assert [(p.trial_id, p.device_key, p.memory_limit_mb) for p in made.placements] == [
        (2, "GPU-0", (USABLE - 50000) // 4 - POLICY.overhead_mb)
    ]
