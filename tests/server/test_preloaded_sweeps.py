"""A `--preload` sweep in a real daemon: its first trials may start fresh, later ones preloaded."""

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

PROBE = str(Path(__file__).parents[1] / "fixtures" / "preload_probe.py")
# Light, and never imported by a fresh trial's bootstrap: it tells a preloaded start apart.
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
            "preload": True,
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


def preloaded_flags(home: Path, sweep_id: int) -> dict[int, int]:
    """Each trial's `preloaded` report, read from its log."""
    flags = {}
    for log in (home / "logs" / f"sweep-{sweep_id}").glob("trial-*.log"):
        for line in log.read_text().splitlines():
            if line.startswith("GPUMUX_REPORT "):
                trial_id = int(log.name.split("-")[1].split(".")[0])
                flags[trial_id] = json.loads(line.removeprefix("GPUMUX_REPORT "))["preloaded"]
    return flags


def test_a_preload_sweep_starts_fresh_until_the_preloading_spawner_is_ready_then_preloaded(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    settings = Settings(
        home=home, url=f"http://127.0.0.1:{free_port()}", preload=FRAMEWORK, poll_interval=0.2
    )
    with (
        embedded(settings) as daemon,
        httpx.Client(base_url=daemon.url, timeout=10, headers=daemon_bearer(home)) as client,
    ):
        probe = [sys.executable, PROBE, FRAMEWORK]
        first = run_sweep(client, tmp_path, probe, params=["x=1,2"])
        assert client.get(f"/sweeps/{first}").json()["preload"] is True
        # The first --preload trial starts the preloading spawner: it cannot be ready yet.
        assert preloaded_flags(home, first)[min(preloaded_flags(home, first))] == 0
        deadline = time.monotonic() + TIMEOUT_S
        sweep_id = first
        while 1 not in preloaded_flags(home, sweep_id).values():
            assert time.monotonic() < deadline, "no trial ever started preloaded"
            sweep_id = run_sweep(client, tmp_path, probe, params=["x=3,4"])
        for trial in trials(client, sweep_id):
            assert (trial["status"], trial["exit_code"]) == ("succeeded", 0)
            assert trial["objective"] == 2 * trial["params"]["x"]

        # Once ready, it stays: every trial of the next sweep starts preloaded, exit status kept.
        failing = run_sweep(client, tmp_path, probe, params=["x=5,6,7", "code=5"])
        assert set(preloaded_flags(home, failing).values()) == {1}
        assert [(t["status"], t["exit_code"]) for t in trials(client, failing)] == [
            ("failed", 5)
        ] * 3

        # A command that is not `python script.py` runs fresh, by exec, in a --preload sweep too.
        shell = run_sweep(
            client,
            tmp_path,
            ["/bin/sh", "-c", 'echo "GPUMUX_REPORT {\\"preloaded\\": 0, \\"y\\": 0}"'],
            params=["x=8"],
        )
        assert list(preloaded_flags(home, shell).values()) == [0]
        assert [t["status"] for t in trials(client, shell)] == ["succeeded"]
