"""Real sweeps through a real daemon: the Keras digits example with real TensorFlow, and the split
search from a sweep at `split: auto` to the profile its workload's next sweep reuses."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import httpx
import pytest
from builders import daemon_bearer
from ports import free_port

from gpumux.config import Settings
from gpumux.server.daemon import embedded

ROOT = Path(__file__).resolve().parents[1]
# The split search's sweeps run on a simulated H200 (gpumux.devices.simulated) whose simulated
# seconds last a quarter of a real one, the search's timers with them.
SIMULATED_MODEL = "h200-torch-mlp"
SIMULATED_SCALE = 0.25
SIMULATED_TRIAL = [sys.executable, "-m", "gpumux.devices.simulated.trial"]
TRIAL_S = 12
# The cores the daemon takes the host to have: where the search starts on this card.
HOST_CORES = 2
pytestmark = pytest.mark.slow


def test_keras_metrics_and_the_cpu_slice_of_a_real_sweep(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", url=f"http://127.0.0.1:{free_port()}")
    with (
        embedded(settings) as daemon,
        httpx.Client(
            base_url=daemon.url, timeout=30, headers=daemon_bearer(settings.home)
        ) as client,
    ):
        created = client.post(
            "/sweeps",
            json={
                # One trial: its metrics and CPU slice are its own, and a sweep's best of
                # several (each direction) is storage's, tested without TensorFlow
                # (tests/storage/test_store.py, `gpumux best` in tests/cli/test_cli.py).
                "params": ["lr=3e-2", "epochs=3"],
                "command": [sys.executable, "examples/digits_keras.py", "--width=32"],
                "workdir": str(ROOT),
                "env": dict(os.environ),
                "split": 2,
                "objective": "val_accuracy:max",
            },
        ).json()
        deadline = time.monotonic() + 300
        while (sweep := client.get(f"/sweeps/{created['id']}").json())["status"] != "finished":
            assert time.monotonic() < deadline, f"sweep did not finish: {sweep}"
            time.sleep(0.2)
        trials = client.get(f"/sweeps/{created['id']}/trials").json()["data"]
        assert [t["status"] for t in trials] == ["succeeded"]
        # The CPU device is the cores this process (the embedded daemon) may run on: each
        # trial gets an equal share of them, one thread at least.
        cores = len(os.sched_getaffinity(0))
        for trial in trials:
            assert (trial["device"], trial["split"]) == ("cpu", 2), trial
            threads = max(1, cores // trial["split"])
            assert trial["cpu_threads"] == threads, (cores, trial)
            reports = client.get(f"/trials/{trial['id']}/reports").json()["data"]
            epochs = [r for r in reports if r["kind"] == "epoch"]
            assert [r["step"] for r in epochs] == [0, 1, 2]
            assert all(r["samples_per_s"] > 0 for r in epochs)
            # Each report carries the samples since the one before (a slow epoch also sends
            # batch reports): together they are every sample of the 3 epochs, once.
            assert sum(r["samples"] or 0 for r in reports) == 3 * 1437
            assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(epochs[-1]["metrics"])
            assert trial["objective"] == epochs[-1]["metrics"]["val_accuracy"]
            log = client.get(f"/trials/{trial['id']}/log", params={"offset": 0}).json()["data"]
            applied = log.index(
                f"gpumux: tensorflow: CPU device, {threads} intra-op and {threads} inter-op"
            )
            assert applied < log.index("Epoch 1/3"), "the slice must precede the first op"
        best = client.get(f"/sweeps/{created['id']}").json()["best"]
        assert (best["id"], best["objective"]) == (trials[0]["id"], trials[0]["objective"])


def run_sweep(client: httpx.Client, params: list[str]) -> list[dict[str, object]]:
    created = client.post(
        "/sweeps",
        json={
            "params": params,
            "command": [*SIMULATED_TRIAL, f"--seconds={TRIAL_S}"],
            "workdir": str(ROOT),
            "env": dict(os.environ),
        },
    ).json()
    assert created["split"] == "auto"
    deadline = time.monotonic() + 240
    while (sweep := client.get(f"/sweeps/{created['id']}").json())["status"] != "finished":
        assert time.monotonic() < deadline, f"sweep did not finish: {sweep}"
        time.sleep(0.2)
    trials: list[dict[str, object]] = client.get(
        f"/sweeps/{created['id']}/trials", params={"limit": 100}
    ).json()["data"]
    assert {t["status"] for t in trials} == {"succeeded"}
    return trials


def test_split_auto_measures_a_profile_and_the_next_sweep_reuses_it(tmp_path: Path) -> None:
    # On a simulated GPU: the rate at each N is the model's, whatever else loads the host (on
    # the CPU the search measured the host's load and, loaded, settled on nothing).
    settings = Settings(
        home=tmp_path / "home",
        url=f"http://127.0.0.1:{free_port()}",
        simulated_gpu=SIMULATED_MODEL,
        simulated_time_scale=SIMULATED_SCALE,
        host_cores=HOST_CORES,
        poll_interval=0.1,
        split_settle=0.2,
        split_window=0.5,
        kill_grace=2.0,
    )
    with (
        embedded(settings) as daemon,
        httpx.Client(
            base_url=daemon.url, timeout=30, headers=daemon_bearer(settings.home)
        ) as client,
    ):
        first = run_sweep(client, ["seed=1..24"])
        profiles = client.get("/profiles").json()
        assert profiles["count"] == 1, profiles
        profile = profiles["data"][0]
        measured = [point["split"] for point in profile["curve"]]
        # The search starts at the host's cores (far below the card's memory ceiling).
        assert first[0]["split"] == HOST_CORES, first[0]
        assert len(measured) >= 2, profile
        assert profile["settled"] and profile["best_split"] in measured, profile
        assert profile["unit"] == "samples/s" and profile["device_name"]
        assert len({t["split"] for t in first}) >= 2, "the first sweep ran at several N"
        shown = client.get(f"/sweeps/{first[0]['sweep_id']}").json()["profiles"]
        assert [p["id"] for p in shown] == [profile["id"]], "the sweep shows its search"

        second = run_sweep(client, ["seed=25..28"])
        assert {t["split"] for t in second} == {profile["best_split"]}
        again = client.get(f"/profiles/{profile['id']}").json()
        assert again["updated_at"] == profile["updated_at"], (
            "the profile was reused, not re-measured"
        )
