"""A report flood on one node of a PostgreSQL cluster: that node keeps its lease (another sweep's
long trial beside the flood is neither killed nor requeued), answers /health, and stops at
SIGTERM while it reads a flood's end."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from builders import daemon_bearer
from flooding import HEALTH_BOUND_S, ROWS, HealthProbe, flood_sweep
from reliability.conftest import DaemonProcess
from sqlalchemy import func, select

from gpumux.status import NodeState, TrialStatus
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Node, Trial, TrialReport

from .conftest import NodeFactory, wait_until

# Leases short enough that a node whose heartbeat waited on a flood's end lost its lease (the
# daemon before the budget held its event loop for over a minute here), long enough that a busy
# 2-core machine's scheduling delays (a renewal late by a second) do not: its supervisors stop
# its trials at the lease less a heartbeat, 8 s after a renewal.
LEASE = {"GPUMUX_NODE_LEASE": "10", "GPUMUX_NODE_HEARTBEAT": "2"}
# A flooded node must exit this soon after SIGTERM: its graceful stop leaves the trials running and
# needs only the tick in progress to end. The daemon before the budget, reading a flood's end
# in one go on its event loop, took over a minute here.
STOP_BOUND_S = 20.0
pytestmark = pytest.mark.slow


def submit(node: DaemonProcess, body: dict[str, object]) -> int:
    with node.client() as client:
        created = client.post("/sweeps", json=body)
    assert created.status_code == 201, created.text
    sweep_id: int = created.json()["id"]
    return sweep_id


def the_trial(db: Sessions, sweep_id: int) -> Trial | None:
    with db.read() as session:
        return session.scalars(select(Trial).where(Trial.sweep_id == sweep_id)).first()


def running(db: Sessions, sweep_id: int) -> Trial | None:
    trial = the_trial(db, sweep_id)
    return trial if trial is not None and trial.status is TrialStatus.running else None


def launched(db: Sessions, sweep_id: int) -> Trial | None:
    """The sweep's trial once it has a log: starting or running, or already ended (a fast host
    can run the whole flood before the daemon records it running)."""
    trial = the_trial(db, sweep_id)
    return trial if trial is not None and trial.log_path is not None else None


def printed_last(log: Path) -> bool:
    """Whether the flood's log ends with its last line (it exits then)."""
    with log.open("rb") as file:
        file.seek(max(0, log.stat().st_size - 64))
        return b"flood: done" in file.read()


def ended(db: Sessions, sweep_id: int) -> Trial | None:
    trial = the_trial(db, sweep_id)
    return trial if trial is not None and trial.status.is_final else None


def long_sweep(workdir: Path) -> dict[str, object]:
    """Another sweep's trial that runs until the test ends, beside the flood (half the CPU)."""
    return {
        "params": ["x=1"],
        "command": [sys.executable, "-c", "import time; time.sleep(3600)"],
        "workdir": str(workdir),
        "env": {"PATH": os.environ["PATH"]},
        "split": 2,
    }


def test_a_flooded_node_keeps_its_lease_and_its_other_trials_and_stops_when_told(
    make_node: NodeFactory, cluster_db: Sessions, tmp_path: Path
) -> None:
    budget = {"GPUMUX_REPORT_ROWS": str(ROWS), **LEASE}
    a = make_node("a", **budget)
    long_id = submit(a, long_sweep(tmp_path))
    long = wait_until("the long trial running on a", lambda: running(cluster_db, long_id), a)
    # Only then a second node, which would requeue a's trials if a's lease lapsed.
    b = make_node("b", **budget)
    with HealthProbe(a.url, daemon_bearer(a.home)) as probe:
        flood_id = submit(a, flood_sweep(tmp_path, split=2))
        flooded = wait_until("the flood's end recorded", lambda: ended(cluster_db, flood_id), a, b)
    assert probe.failures == []
    assert probe.worst < HEALTH_BOUND_S, f"/health took {probe.worst:.1f} s on node a"
    assert flooded.status is TrialStatus.succeeded and flooded.reports_dropped > 0
    with cluster_db.read() as session:
        rows = session.scalar(
            select(func.count()).select_from(TrialReport).where(TrialReport.trial_id == flooded.id)
        )
        node_a = session.scalars(select(Node).where(Node.name == "a")).one()
    assert rows is not None and rows <= ROWS
    # The other sweep's trial ran on, on a, in its first attempt: a's lease never lapsed.
    after = the_trial(cluster_db, long_id)
    assert after is not None
    assert (after.status, after.attempt, after.node_id) == (
        TrialStatus.running,
        1,
        long.node_id,
    ), a.log_tail()
    assert node_a.state is NodeState.active and node_a.incarnation == 1

    # A second flood, on a alone, stopped while a reads its end: a exits at once.
    b.stop()
    again = submit(a, flood_sweep(tmp_path, split=2))
    trial = wait_until("the second flood launched", lambda: launched(cluster_db, again), a)
    assert trial.log_path is not None
    log = Path(trial.log_path)
    wait_until("the second flood printed", lambda: printed_last(log), a)
    began = time.monotonic()
    a.send(signal.SIGTERM)
    a.wait(timeout=120)
    took = time.monotonic() - began
    assert took < STOP_BOUND_S, f"node a took {took:.1f} s to stop\n{a.log_tail()}"
