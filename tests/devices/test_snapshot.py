"""Which GPUs a daemon may use: the setting, else its own CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import pytest

from gpumux.devices.snapshot import DeviceSnapshot, is_visible, visible_gpus


def gpu(index: int, uuid: str | None) -> DeviceSnapshot:
    return DeviceSnapshot(
        key=uuid or f"gpu:{index}",
        kind="gpu",
        index=index,
        name="NVIDIA H100 80GB HBM3",
        uuid=uuid,
        memory_total_mb=81559,
        memory_used_mb=0,
        memory_free_mb=81559,
        utilization_pct=0,
        processes=(),
        cpu_count=None,
    )


@pytest.mark.parametrize(
    ("gpus", "environ", "visible"),
    [
        ("1", {"CUDA_VISIBLE_DEVICES": "0"}, "1"),
        (None, {"CUDA_VISIBLE_DEVICES": "0,GPU-ab"}, "0,GPU-ab"),
        (None, {}, None),
        # An empty setting is a choice (no GPU), not an absence.
        ("", {"CUDA_VISIBLE_DEVICES": "0"}, ""),
        (None, {"CUDA_VISIBLE_DEVICES": ""}, ""),
    ],
)
def test_the_setting_wins_over_the_environment(
    gpus: str | None, environ: dict[str, str], visible: str | None
) -> None:
    assert visible_gpus(gpus, environ) == visible


def test_visible_gpus_are_named_by_index_or_uuid_prefix() -> None:
    first, second = gpu(0, "GPU-0b5c1e6a-3f2d"), gpu(1, None)
    assert [is_visible(g, None) for g in (first, second)] == [True, True]
    assert [is_visible(g, "1") for g in (first, second)] == [False, True]
    assert [is_visible(g, " GPU-0b5c , 7") for g in (first, second)] == [True, False]
    assert [is_visible(g, "") for g in (first, second)] == [False, False]
