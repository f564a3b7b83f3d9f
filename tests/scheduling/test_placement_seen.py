"""Placement budgets a first wave's trial, seen holding less, at the slice of the N its sweep's
search has since raised, not at its own cap: the new N's trials fit beside it at once."""

from __future__ import annotations

from fractions import Fraction
from types import SimpleNamespace
from typing import Any

from gpumux.devices.snapshot import DeviceSnapshot, GpuProcess
from gpumux.scheduling.filling import grown_split
from gpumux.scheduling.placement import PackingPolicy, PendingTrial, RunningTrial, plan

H100_MB = 81559
POLICY = PackingPolicy()
USABLE = H100_MB - POLICY.reserve_mb
SWEEP = 7
# The first wave: 2 trials at N=2, each capped at half the card; the search has since raised
# the sweep's N to 5, whose slices are a fifth.
WAVE_CAP = USABLE // 2 - POLICY.overhead_mb
NEW_CAP = USABLE // 5 - POLICY.overhead_mb
PIDS = (5001, 5002)


def device(held_mb: int | None, *, unlisted_mb: int = 0) -> DeviceSnapshot:
    """The H100 with the wave's processes listed, each holding `held_mb` (None: NVML lists
    them without their memory), and `unlisted_mb` used that no process accounts for."""
    used = (held_mb or 0) * len(PIDS) + unlisted_mb
    return DeviceSnapshot(
        key="GPU-0",
        kind="gpu",
        index=0,
        name="NVIDIA H100 80GB HBM3",
        uuid="GPU-0",
        memory_total_mb=H100_MB,
        memory_used_mb=used,
        memory_free_mb=H100_MB - used,
        utilization_pct=0,
        processes=tuple(GpuProcess(pid=pid, used_memory_mb=held_mb) for pid in PIDS),
        cpu_count=None,
    )


def wave(seen_mb: int | None, *, grown: int | None = 5) -> list[RunningTrial]:
    return [
        RunningTrial(
            trial_id=100 + slot,
            device_key="GPU-0",
            slot=slot,
            memory_limit_mb=WAVE_CAP,
            split=2,
            grown_split=grown,
            seen_mb=seen_mb,
        )
        for slot in range(len(PIDS))
    ]


def placed(running: list[RunningTrial], snapshot: DeviceSnapshot) -> list[int]:
    """The caps of what plan() places from a queue of 5 of the sweep at N=5."""
    queue = [
        PendingTrial(trial_id=i, split=None, tuned={"GPU-0": 5}, sweep_id=SWEEP) for i in range(5)
    ]
    result = plan(
        devices=[snapshot],
        running=running,
        pending=queue,
        policy=POLICY,
        our_pids=PIDS,
        # The share the wave holds beyond 1/5, as filling.credits gives it.
        credits={("GPU-0", SWEEP): 2 * (Fraction(1, 2) - Fraction(1, 5))},
    )
    return [p.memory_limit_mb or 0 for p in result.placements]


def test_a_wave_seen_holding_little_lets_the_new_n_in_at_once() -> None:
    assert placed(wave(seen_mb=4000), device(4000)) == [NEW_CAP] * 3


def test_a_wave_not_seen_keeps_its_caps() -> None:
    assert placed(wave(seen_mb=None), device(None)) == []


def test_a_wave_seen_holding_more_than_a_new_slice_keeps_its_caps() -> None:
    # As a TensorFlow trial shows: its whole slice.
    assert placed(wave(seen_mb=NEW_CAP + 1), device(NEW_CAP + 1)) == []
    assert placed(wave(seen_mb=WAVE_CAP), device(WAVE_CAP)) == []


def test_a_wave_whose_n_was_not_raised_keeps_its_caps() -> None:
    assert placed(wave(seen_mb=4000, grown=None), device(4000)) == []


def test_memory_nvml_does_not_report_free_bounds_the_new_trials() -> None:
    # 20 GB used that no process lists: free, less the reserve and what the wave may still
    # grow into within its new slices, holds one more slice, not three.
    unlisted = 20000
    free = H100_MB - 2 * 4000 - unlisted - POLICY.reserve_mb
    growth = 2 * (NEW_CAP + POLICY.overhead_mb - 4000)
    fit = (free - growth) // (NEW_CAP + POLICY.overhead_mb)
    assert 0 < fit < 3
    assert placed(wave(seen_mb=4000), device(4000, unlisted_mb=unlisted)) == [NEW_CAP] * fit


def test_a_fixed_split_sweep_is_never_raised() -> None:
    def trial(split: int | None) -> Any:
        return SimpleNamespace(
            sweep_id=SWEEP, device="GPU-0", split=2, sweep=SimpleNamespace(split=split)
        )

    tuned = {SWEEP: {"GPU-0": 5}}
    assert grown_split(trial(split=None), tuned) == 5
    assert grown_split(trial(split=2), tuned) is None
    assert grown_split(trial(split=None), {SWEEP: {"GPU-0": 2}}) is None
