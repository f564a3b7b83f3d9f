"""A real daemon gives the slot a higher N opens to an adaptive sweep's next trial at once, not
once the trial launched under the lower N ends."""

from __future__ import annotations

import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from builders import daemon_bearer
from ports import free_port
from test_prior_daemon import device_model

from gpumux.config import Settings
from gpumux.server.daemon import embedded
from gpumux.splits.curve import workload_fingerprint
from gpumux.storage import profiles as profile_store
from gpumux.storage.engine import make_engine, make_sessions
from gpumux.storage.migrate import upgrade

# Reports samples (the split search's rates) and a loss (the sampler's objective) every 0.05 s
# until the file named by its first argument exists, or for a minute at most.
TRIAL = """
import json, os, sys, time
stop, x = sys.argv[1], float(sys.argv[2])
for step in range(1200):
    if os.path.exists(stop):
        break
    print("GPUMUX_REPORT " + json.dumps({"step": step, "samples": 50, "loss": x}), flush=True)
    time.sleep(0.05)
"""


def start_at_one(settings: Settings, workdir: str, command: list[str]) -> None:
    """A settled profile of the command with another batch size at N=1: the sweep's split
    search starts there, on any host, and climbs to N=2 once N=1 is measured."""
    settings.home.mkdir(parents=True)
    engine = make_engine(settings.database_url)
    try:
        upgrade(engine)
        with make_sessions(engine).write.begin() as session:
            profile_store.save_profile(
                session=session,
                device_name=device_model(settings),
                fingerprint=workload_fingerprint([workdir, *command], ["batch_size=64"]),
                command=command,
                workdir=workdir,
                param_tokens=["batch_size=64"],
                unit="samples/s",
                curve=[{"split": 1, "throughput": 1000.0}],
                best_split=1,
                settled=True,
                reason="knee",
                sweep_id=None,
            )
    finally:
        engine.dispose()


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def test_the_slot_a_higher_n_opens_gets_the_next_trial_before_the_first_ends(
    tmp_path: Path,
) -> None:
    settings = Settings(
        home=tmp_path / "home",
        url=f"http://127.0.0.1:{free_port()}",
        poll_interval=0.2,
        split_settle=0.3,
        split_window=0.6,
    )
    stop = tmp_path / "stop"
    workdir = str(tmp_path.resolve())
    command = [sys.executable, "-c", TRIAL, str(stop), "{x}"]
    start_at_one(settings, workdir, command)
    with (
        embedded(settings) as daemon,
        httpx.Client(
            base_url=daemon.url, timeout=30, headers=daemon_bearer(settings.home)
        ) as client,
    ):
        created = client.post(
            "/sweeps",
            json={
                "params": ["batch_size=32", "x=1..100"],
                "command": command,
                "workdir": workdir,
                "search": "tpe",
                "trials": 3,
                "objective": "loss:min",
            },
        )
        assert created.status_code == 201, created.text
        sweep_id = created.json()["id"]

        def trials() -> list[dict[str, Any]]:
            rows = client.get(f"/sweeps/{sweep_id}/trials", params={"limit": 10}).json()["data"]
            return sorted(rows, key=lambda row: row["number"])

        # The first trial runs alone at N=1 until the test ends it: a second one may start only
        # in a slot that N=2 opened beside it. A minute lets the search measure N=1 under load.
        deadline = time.monotonic() + 60
        while len([row for row in trials() if row["started_at"]]) < 2:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        stop.touch()
        deadline = time.monotonic() + 60
        while (sweep := client.get(f"/sweeps/{sweep_id}").json())["status"] != "finished":
            assert time.monotonic() < deadline, f"the sweep did not finish: {sweep}"
            time.sleep(0.2)
        rows = trials()
    first, second = rows[:2]
    assert first["split"] == 1, first
    # Asked (stored) and started while the first, launched under N=1, still ran.
    assert second["split"] == 2, second
    assert at(second["queued_at"]) < at(first["ended_at"]), (first, second)
    assert at(second["started_at"]) < at(first["ended_at"]), (first, second)
    assert {row["status"] for row in rows} == {"succeeded"}, rows
