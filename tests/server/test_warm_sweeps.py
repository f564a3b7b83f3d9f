"""A `--warm` sweep in a real daemon: its first trials may start cold, later ones warm."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from builders import daemon_bearer
from ports import free_port
from test_daemon import wait_finished

from gpumux.config import Settings
from gpumux.server.daemon import embedded

PROBE = str(Path(__file__).parents[1] / "fixtures" / "warm_probe.py")
# Light, and never imported by a cold trial's bootstrap: it tells a warm start from a cold one.
FRAMEWORK = "numpy"
TIMEOUT_S = 90.0


def run_sweep(client: httpx.Client, workdir: Path, command: list[str], **fields: Any) -> int:
    created = client.post(
        "/sweeps",
        json={
            "command": command,
            "workdir": str(workdir),
            "env": dict(os.environ),
            "split": 2,
            "warm": True,
            "objective": "y:max",
            **fields,
        },
    )
    assert created.status_code == 201, created.text
    sweep_id = int(created.json()["id"])
    wait_finished(client, sweep_id)
    return sweep_id


def trials(client: httpx.Client, sweep_id: int) -> list[dict[str, Any]]:
    return list(client.get(f"/sweeps/{sweep_id}/trials", params={"limit": 100}).json()["data"])


def warm_flags(home: Path, sweep_id: int) -> dict[int, int]:
    """Each trial's `warm` report, read from its log."""
    flags = {}
    for log in (home / "logs" / f"sweep-{sweep_id}").glob("trial-*.log"):
        for line in log.read_text().splitlines():
            if line.startswith("GPUMUX_REPORT "):
                trial_id = int(log.name.split("-")[1].split(".")[0])
                flags[trial_id] = json.loads(line.removeprefix("GPUMUX_REPORT "))["warm"]
    return flags


def test_a_warm_sweep_starts_cold_until_the_warm_spawner_is_ready_then_warm(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    settings = Settings(
        home=home, url=f"http://127.0.0.1:{free_port()}", warm_preload=FRAMEWORK, poll_interval=0.2
    )
    with (
        embedded(settings) as daemon,
        httpx.Client(base_url=daemon.url, timeout=10, headers=daemon_bearer(home)) as client,
    ):
        probe = [sys.executable, PROBE, FRAMEWORK]
        first = run_sweep(client, tmp_path, probe, params=["x=1,2"])
        assert client.get(f"/sweeps/{first}").json()["warm"] is True
        # The first warm trial starts the warm spawner: it cannot be ready yet.
        assert warm_flags(home, first)[min(warm_flags(home, first))] == 0
        deadline = time.monotonic() + TIMEOUT_S
        sweep_id = first
        while 1 not in warm_flags(home, sweep_id).values():
            assert time.monotonic() < deadline, "no trial ever started warm"
            sweep_id = run_sweep(client, tmp_path, probe, params=["x=3,4"])
        for trial in trials(client, sweep_id):
            assert (trial["status"], trial["exit_code"]) == ("succeeded", 0)
            assert trial["objective"] == 2 * trial["params"]["x"]

        # Once ready, it stays: every trial of the next sweep is warm, and its exit status kept.
        failing = run_sweep(client, tmp_path, probe, params=["x=5,6,7", "code=5"])
        assert set(warm_flags(home, failing).values()) == {1}
        assert [(t["status"], t["exit_code"]) for t in trials(client, failing)] == [
            ("failed", 5)
        ] * 3

        # A command that is not `python script.py` runs cold, by exec, in a warm sweep too.
        shell = run_sweep(
            client,
            tmp_path,
            ["/bin/sh", "-c", 'echo "GPUMUX_REPORT {\\"warm\\": 0, \\"y\\": 0}"'],
            params=["x=8"],
        )
        assert list(warm_flags(home, shell).values()) == [0]
        assert [t["status"] for t in trials(client, shell)] == ["succeeded"]
