"""A fixed split that fits none of this node's devices: failed when it fits no node's, else left
queued for the nodes it may fit (both backends, a real filler over real sessions)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from builders import stored_sweep
from sqlalchemy import update

from gpumux.config import Settings
from gpumux.devices.accounting import Overheads
from gpumux.devices.snapshot import DeviceSnapshot
from gpumux.scheduling.filling import SlotFiller
from gpumux.scheduling.launching import Launcher
from gpumux.scheduling.watched import Watched
from gpumux.search.studies import Studies
from gpumux.splits.searches import SplitSearches
from gpumux.status import NodeState, TrialStatus
from gpumux.storage import membership
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Node
from gpumux.storage.nodes import NodeIdentity, ThisNode

SMALL_MB = 16 * 1024
LARGE_MB = 80 * 1024


def gpu(memory_mb: int) -> DeviceSnapshot:
    """An idle GPU of this much memory, as this node's probe reports it."""
    return DeviceSnapshot(
        key="gpu:0",
        kind="gpu",
        index=0,
        name=f"Test GPU {memory_mb // 1024} GB",
        uuid="GPU-0",
        memory_total_mb=memory_mb,
        memory_used_mb=0,
        memory_free_mb=memory_mb,
        utilization_pct=0,
        processes=(),
        cpu_count=None,
    )


def row_devices(*memory_mb: int, kind: str = "gpu") -> list[dict[str, Any]]:
    """What a node's row says of its GPUs, as its heartbeat writes it."""
    return [
        {"key": f"gpu:{i}", "kind": kind, "name": f"GPU {m // 1024} GB", "memory_mb": m}
        for i, m in enumerate(memory_mb)
    ]


def join(db: Sessions, name: str, devices: list[dict[str, Any]]) -> NodeIdentity:
    with db.write.begin() as session:
        return membership.join(
            session=session,
            name=name,
            home=f"home-{name}",
            url=None,
            pid=1,
            lease_s=30.0,
            lost_retries=2,
            devices=devices,
        )


def filler(settings: Settings, db: Sessions, node: NodeIdentity) -> SlotFiller:
    """This node's filler, as its scheduler builds it."""
    overheads = Overheads(configured_mb=settings.overhead_mb)
    here = ThisNode(node)
    return SlotFiller(
        settings=settings,
        sessions=db,
        searches=SplitSearches(settings, overheads=overheads, here=here),
        studies=Studies(),
        launcher=Launcher(settings=settings, sessions=db, url="http://unused", here=here),
        watched=Watched(kill_grace=1.0, heartbeat_timeout=60.0),
        overheads=overheads,
        here=here,
    )


def split_16_trials(db: Sessions, tmp_path: Path) -> list[int]:
    """A queued sweep of two trials at split 16: 16 GB cards are too small for it."""
    with db.write.begin() as session:
        sweep = stored_sweep(session, tmp_path, 2, split=16)
        return [t.id for t in trial_store.list_trials(session=session, sweep_id=sweep.id)[0]]


def states(db: Sessions, trial_ids: list[int]) -> list[tuple[TrialStatus, int | None, str]]:
    with db.read() as session:
        trials = [trial_store.get_trial(session=session, trial_id=i) for i in trial_ids]
        return [(t.status, t.node_id, t.error or "") for t in trials if t is not None]


def test_a_split_too_big_here_stays_queued_for_a_node_it_fits(
    db: Sessions, settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    here = join(db, "small", row_devices(SMALL_MB))
    join(db, "large", row_devices(SMALL_MB, LARGE_MB))
    trial_ids = split_16_trials(db, tmp_path)
    filling = filler(settings, db, here)
    with caplog.at_level(logging.INFO, logger="gpumux.scheduling.filling"):
        for _ in range(3):
            filling.fill([gpu(SMALL_MB)], group_of={})
    assert states(db, trial_ids) == [(TrialStatus.queued, None, "")] * 2
    (told,) = [r.getMessage() for r in caplog.records if "stay queued" in r.getMessage()]
    assert "node large's devices may fit them" in told and "--split" in told


def test_alone_a_split_too_big_is_failed_with_what_fits(
    db: Sessions, settings: Settings, tmp_path: Path
) -> None:
    here = join(db, "small", row_devices(SMALL_MB))
    trial_ids = split_16_trials(db, tmp_path)
    filler(settings, db, here).fill([gpu(SMALL_MB)], group_of={})
    for status, _, error in states(db, trial_ids):
        assert status is TrialStatus.failed
        assert "use --split" in error and "on node" not in error


def test_a_split_no_node_fits_is_failed_with_every_node_s_reason(
    db: Sessions, settings: Settings, tmp_path: Path
) -> None:
    here = join(db, "small", row_devices(SMALL_MB))
    join(db, "other", row_devices(SMALL_MB, SMALL_MB))
    trial_ids = split_16_trials(db, tmp_path)
    filler(settings, db, here).fill([gpu(SMALL_MB)], group_of={})
    for status, _, error in states(db, trial_ids):
        assert status is TrialStatus.failed
        assert "on node other: split 16 leaves" in error


def test_a_node_no_longer_active_is_not_waited_for(
    db: Sessions, settings: Settings, tmp_path: Path
) -> None:
    here = join(db, "small", row_devices(SMALL_MB))
    gone = join(db, "large", row_devices(LARGE_MB))
    with db.write.begin() as session:
        session.execute(update(Node).where(Node.id == gone.id).values(state=NodeState.left))
    trial_ids = split_16_trials(db, tmp_path)
    filler(settings, db, here).fill([gpu(SMALL_MB)], group_of={})
    assert {status for status, _, _ in states(db, trial_ids)} == {TrialStatus.failed}


@pytest.mark.parametrize(
    "devices",
    [row_devices(LARGE_MB, kind="mig"), [{"key": "gpu:0"}], ["not a device"]],
    ids=["unknown-kind", "no-kind", "not-a-dict"],
)
def test_a_device_that_cannot_be_judged_keeps_the_trial_queued(
    db: Sessions,
    settings: Settings,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    devices: list[Any],
) -> None:
    here = join(db, "small", row_devices(SMALL_MB))
    join(db, "odd", devices)
    trial_ids = split_16_trials(db, tmp_path)
    filling = filler(settings, db, here)
    with caplog.at_level(logging.WARNING, logger="gpumux.scheduling.filling"):
        filling.fill([gpu(SMALL_MB)], group_of={})
        filling.fill([gpu(SMALL_MB)], group_of={})
    assert states(db, trial_ids) == [(TrialStatus.queued, None, "")] * 2
    (told,) = [r.getMessage() for r in caplog.records if "stay queued" in r.getMessage()]
    assert "node odd lists a device gpumux cannot judge" in told
