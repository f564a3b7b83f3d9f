"""The per-device overhead one object owns, for placement and the split search alike."""

from __future__ import annotations

import logging

import pytest

from gpumux.devices.accounting import OVERHEAD_BELIEVABLE, Overheads
from gpumux.devices.snapshot import DeviceSnapshot, GpuProcess

CONFIGURED_MB = 1024
CAP_MB = 4096


def gpu(key: str, *held_mb: int) -> DeviceSnapshot:
    """A GPU on which trial i (process group 100 + i, capped at CAP_MB) holds held_mb[i]."""
    return DeviceSnapshot(
        key=key,
        kind="gpu",
        index=0,
        name="NVIDIA H100 80GB HBM3",
        uuid=key,
        memory_total_mb=81559,
        memory_used_mb=sum(held_mb),
        memory_free_mb=81559 - sum(held_mb),
        utilization_pct=0,
        processes=tuple(
            GpuProcess(pid=100 + i, used_memory_mb=used) for i, used in enumerate(held_mb)
        ),
        cpu_count=None,
    )


CPU = DeviceSnapshot(
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
GROUPS = {100 + i: 100 + i for i in range(3)}
CAPS = {group: CAP_MB for group in GROUPS}


def test_the_configured_overhead_holds_until_one_is_measured_on_the_device() -> None:
    overheads = Overheads(configured_mb=CONFIGURED_MB)
    assert overheads.for_device("GPU-a") == CONFIGURED_MB and overheads.measured() == {}
    overheads.observe([gpu("GPU-a", CAP_MB + 700, CAP_MB - 100)], group_of=GROUPS, caps=CAPS)
    assert overheads.for_device("GPU-a") == 700
    assert overheads.for_device("GPU-b") == CONFIGURED_MB
    assert overheads.measured() == {"GPU-a": 700}


def test_the_overhead_only_rises() -> None:
    overheads = Overheads(configured_mb=CONFIGURED_MB)
    for held in (CAP_MB + 700, CAP_MB + 300, CAP_MB + 900, CAP_MB):
        overheads.observe([gpu("GPU-a", held)], group_of=GROUPS, caps=CAPS)
    assert overheads.measured() == {"GPU-a": 900}


def test_a_trial_far_beyond_its_cap_is_a_cap_that_did_not_apply(
    caplog: pytest.LogCaptureFixture,
) -> None:
    overheads = Overheads(configured_mb=CONFIGURED_MB)
    uncapped = CAP_MB + OVERHEAD_BELIEVABLE * CONFIGURED_MB + 1
    with caplog.at_level(logging.WARNING, logger="gpumux.devices.accounting"):
        overheads.observe([gpu("GPU-a", uncapped)], group_of=GROUPS, caps=CAPS)
    assert overheads.for_device("GPU-a") == CONFIGURED_MB
    assert [r.getMessage() for r in caplog.records] == [
        f"device GPU-a: a trial holds {uncapped - CAP_MB} MB beyond its slice; "
        "its cap did not apply"
    ]


def test_only_devices_that_list_processes_are_measured() -> None:
    overheads = Overheads(configured_mb=CONFIGURED_MB)
    assert overheads.measurable([CPU, gpu("GPU-a")]) and not overheads.measurable([CPU])
    overheads.observe([CPU], group_of=GROUPS, caps=CAPS)
    assert overheads.measured() == {}


def test_what_is_measured_is_handed_out_as_a_copy() -> None:
    overheads = Overheads(configured_mb=CONFIGURED_MB)
    overheads.measured()["GPU-a"] = 1
    assert overheads.for_device("GPU-a") == CONFIGURED_MB


def test_a_workloads_measured_context_is_its_overhead_unless_a_trial_passed_its_cap_by_more() -> (
    None
):
    overheads = Overheads(configured_mb=CONFIGURED_MB)
    # A PyTorch workload's context, measured from its pool: far below the configured overhead,
    # which it replaces for that workload alone.
    assert overheads.for_device("GPU-a", 300) == 300
    assert overheads.for_device("GPU-a") == CONFIGURED_MB
    # A trial seen beyond its cap by less (a pool short of its cap) leaves it; by more (a
    # TensorFlow trial's context) raises it. A workload with no context takes what was seen.
    overheads.observe([gpu("GPU-a", CAP_MB + 100)], group_of=GROUPS, caps=CAPS)
    assert overheads.for_device("GPU-a", 300) == 300
    assert overheads.for_device("GPU-a") == 100
    overheads.observe([gpu("GPU-a", CAP_MB + 600)], group_of=GROUPS, caps=CAPS)
    assert overheads.for_device("GPU-a", 300) == 600
    assert overheads.for_device("GPU-b", 300) == 300
