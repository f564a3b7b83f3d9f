"""The order filling offers the queue to placement in: a trial that reserved keeps its turn."""

from __future__ import annotations

from gpumux.devices.snapshot import DeviceSnapshot
from gpumux.scheduling.filling import heads_first
from gpumux.scheduling.placement import PackingPolicy, PendingTrial, RunningTrial, plan


def cpu() -> DeviceSnapshot:
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
        cpu_count=8,
    )


def test_a_trial_that_reserved_the_device_goes_first_at_the_next_fill() -> None:
    # Sweep 1 (N=2) holds half the CPU; sweep 2's trial (N=1) is first in line and reserves it.
    running = [RunningTrial(trial_id=1, device_key="cpu", slot=0, memory_limit_mb=None, split=2)]
    sweep_of = {11: 1, 12: 1, 21: 2, 22: 2}
    fair = [PendingTrial(21, 1), PendingTrial(11, 2), PendingTrial(22, 1), PendingTrial(12, 2)]
    first = plan(devices=[cpu()], running=running, pending=fair, policy=PackingPolicy())
    assert first.placements == [] and first.reserved == {"cpu": 21}
    heads = [sweep_of[trial_id] for trial_id in first.reserved.values()]
    # The half freed; fair share now puts sweep 1 first, which would take it again.
    refair = [PendingTrial(11, 2), PendingTrial(12, 2), PendingTrial(21, 1), PendingTrial(22, 1)]
    ordered = heads_first(refair, heads, sweep_of)
    assert [t.trial_id for t in ordered] == [21, 11, 12, 22]
    (placed,) = plan(
        devices=[cpu()], running=[], pending=ordered, policy=PackingPolicy()
    ).placements
    assert (placed.trial_id, placed.split) == (21, 1)
    assert heads_first(refair, [], sweep_of) == refair
