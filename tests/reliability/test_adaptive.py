"""Adaptive sweeps under a real daemon: trials asked as slots free, pruned trials free their
slot, and a kill -9 in the middle loses no trial and runs none twice."""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from .conftest import DaemonFactory, DaemonProcess
from .test_restart import FAST_KILL, POLL_S, alive, assert_no_orphans, wait_until

STEPPER = Path(__file__).parent.parent / "fixtures" / "stepper.py"
FINAL = {"succeeded", "failed", "cancelled", "lost", "pruned"}


def submit(daemon: DaemonProcess, folder: Path, *params: str, **fields: Any) -> int:
    body = {
        "params": list(params),
        "command": [sys.executable, str(STEPPER), str(folder)],
        "workdir": str(folder),
        "env": {"PATH": os.environ["PATH"]},
        "objective": "loss:min",
        **fields,
    }
    with daemon.client() as client:
        created = client.post("/sweeps", json=body)
    assert created.status_code == 201, created.text
    sweep_id: int = created.json()["id"]
    return sweep_id


def trials(daemon: DaemonProcess, sweep_id: int) -> list[dict[str, Any]]:
    with daemon.client() as client:
        answer = client.get(f"/sweeps/{sweep_id}/trials", params={"limit": 1000})
    rows: list[dict[str, Any]] = answer.json()["data"]
    return rows


def finished(daemon: DaemonProcess, sweep_id: int) -> list[dict[str, Any]]:
    def done() -> bool:
        with daemon.client() as client:
            return client.get(f"/sweeps/{sweep_id}").json()["status"] == "finished"

    wait_until(daemon, f"sweep {sweep_id} to finish", done)
    return trials(daemon, sweep_id)


def at(row: dict[str, Any], field: str) -> datetime:
    return datetime.fromisoformat(row[field])


def test_a_tpe_sweep_asks_each_trial_when_a_slot_frees_within_its_budget(
    make_daemon: DaemonFactory, tmp_path: Path
) -> None:
    daemon = make_daemon()
    sweep_id = submit(
        daemon, tmp_path, "x=1..9", "lr=1e-4..1e-1", search="tpe", trials=6, split=2, seed=3
    )
    most_unfinished = 0
    while True:
        rows = trials(daemon, sweep_id)
        most_unfinished = max(most_unfinished, sum(r["status"] not in FINAL for r in rows))
        if len(rows) == 6 and all(r["status"] in FINAL for r in rows):
            break
        assert len(rows) <= 6
        time.sleep(POLL_S)
    rows = finished(daemon, sweep_id)

    assert [r["number"] for r in rows] == list(range(6))
    assert {r["status"] for r in rows} == {"succeeded"} and most_unfinished <= 2
    for row in rows:
        assert 1 <= row["params"]["x"] <= 9 and 1e-4 <= row["params"]["lr"] <= 1e-1
        assert row["step"] == 4 and row["objective"] == row["params"]["x"] * 0.9**4
    # Two slots: a trial is asked only once all but one of the trials before it have ended.
    for k, row in enumerate(rows):
        ended_before = [r for r in rows[:k] if at(r, "ended_at") <= at(row, "queued_at")]
        assert len(ended_before) >= k - 1, (k, row)


def test_a_pruned_trial_is_stopped_at_its_step_and_its_slot_goes_to_the_next(
    make_daemon: DaemonFactory, tmp_path: Path
) -> None:
    daemon = make_daemon(env=FAST_KILL)
    # One slot: x=1 runs first and sets the median; x=50 is far worse and would run 400 steps.
    sweep_id = submit(daemon, tmp_path, "x=1,50,2", split=1, prune="median:n_startup_trials=1")
    rows = {r["params"]["x"]: r for r in finished(daemon, sweep_id)}

    loser = rows[50]
    assert loser["status"] == "pruned" and loser["signal"] == signal.SIGTERM
    # Pruned at its first step, 50 against the median's 1; it reported on until SIGTERM came.
    assert loser["error"] == "pruned at step 0 by the median:n_startup_trials=1 pruner (loss 50)"
    assert loser["step"] is not None and loser["step"] < 400
    assert rows[1]["status"] == rows[2]["status"] == "succeeded"
    assert at(loser, "ended_at") <= at(rows[2], "started_at")
    pid = int((tmp_path / f"started-{loser['id']}").read_text().split()[1])
    assert not alive(pid)
    with daemon.client() as client:
        sweep = client.get(f"/sweeps/{sweep_id}").json()
        metrics = client.get("/metrics").text
    assert sweep["counts"] == {"succeeded": 2, "pruned": 1}
    assert 'gpumux_trials{state="pruned"} 1.0' in metrics
    assert_no_orphans(daemon)


def test_a_kill_9_in_an_adaptive_sweep_loses_no_trial_and_runs_none_twice(
    make_daemon: DaemonFactory, tmp_path: Path
) -> None:
    daemon = make_daemon(env=FAST_KILL)
    (tmp_path / "hold").touch()
    sweep_id = submit(daemon, tmp_path, "x=1..9", search="tpe", trials=5, split=2, seed=4)

    def two_asked() -> list[dict[str, Any]] | None:
        rows = trials(daemon, sweep_id)
        return rows if len(rows) == 2 else None

    running = wait_until(daemon, "two trials to be asked", two_asked)
    wait_until(
        daemon,
        "both to run",
        lambda: all((tmp_path / f"started-{r['id']}").exists() for r in running),
    )

    daemon.kill9()
    (tmp_path / "release-all").touch()
    daemon.start()
    rows = finished(daemon, sweep_id)

    assert [r["number"] for r in rows] == list(range(5))
    assert {r["status"] for r in rows} == {"succeeded"}
    starts = {r["id"]: (tmp_path / f"started-{r['id']}").read_text().split()[0::2] for r in rows}
    assert starts == {r["id"]: ["1"] for r in rows}
    assert_no_orphans(daemon)
