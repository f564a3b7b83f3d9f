"""A trial that floods its log with report lines: the daemon stays responsive, stores a bounded
number of rows, keeps what pruners and the split search need, and says what it dropped."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
from builders import daemon_bearer
from flooding import (
    HEALTH_BOUND_S,
    LINES,
    ROWS,
    STEPS,
    TAIL,
    HealthProbe,
    flood_sweep,
    last_value_per_step,
)

from .conftest import DaemonFactory

WAIT_S = 600.0


def ended(client: httpx.Client, sweep_id: int) -> dict[str, Any] | None:
    trials = client.get(f"/sweeps/{sweep_id}/trials").json()["data"]
    return (
        trials[0]
        if trials and trials[0]["status"] not in ("queued", "starting", "running")
        else None
    )


def test_a_report_flood_leaves_health_answering_and_the_database_bounded(
    make_daemon: DaemonFactory, tmp_path: Path
) -> None:
    daemon = make_daemon(env={"GPUMUX_REPORT_ROWS": str(ROWS)})
    with HealthProbe(daemon.url, daemon_bearer(daemon.home)) as probe:
        with daemon.client(timeout=WAIT_S) as client:
            created = client.post("/sweeps", json=flood_sweep(tmp_path))
            assert created.status_code == 201, created.text
            sweep_id = created.json()["id"]
            deadline = time.monotonic() + WAIT_S
            while (trial := ended(client, sweep_id)) is None:
                assert time.monotonic() < deadline, daemon.log_tail()
                time.sleep(0.2)
            # And after its end, while whatever the daemon still does with the flood goes on.
            settle = time.monotonic() + 3.0
            while time.monotonic() < settle:
                time.sleep(0.2)
    size = sum(f.stat().st_size for f in daemon.home.glob("gpumux.db*"))
    print(f"/health: worst {probe.worst:.3f} s of {probe.count}; database {size:,} B")
    assert probe.failures == []
    assert probe.worst < HEALTH_BOUND_S

    assert trial["status"] == "succeeded", trial
    # The flooding trial's own result is whole: its last line's loss is its objective.
    assert trial["objective"] == LINES + TAIL - 1
    assert trial["reports_dropped"] > 0
    with daemon.client() as client:
        page = client.get(f"/trials/{trial['id']}/reports", params={"limit": 1000}).json()
    assert page["count"] <= ROWS
    values: dict[int, float] = {}
    for report in page["data"]:
        values[report["step"]] = report["metrics"]["loss"]
    assert {step: values.get(step) for step in range(STEPS)} == last_value_per_step()
    # Every sample counts, dropped reports' too: the split search's throughput is right.
    assert sum(report["samples"] for report in page["data"]) == LINES + TAIL
