"""A real PyTorch built without CUDA, placed on a (simulated) GPU: said once by `gpumux sweep`,
shown by the API the dashboard reads, and left out of the GPU's split search."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from builders import daemon_bearer
from ports import free_port

from gpumux.config import Settings
from gpumux.runtime.frameworks import NO_GPU_FIX
from gpumux.server.daemon import embedded

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LOOP = str(FIXTURES / "torch_loop.py")
DEADLINE_S = 300


@pytest.fixture(autouse=True, scope="module")
def _cpu_only_torch() -> None:
    """Skips unless PyTorch is built without CUDA; asked when this file's tests run, not in
    every parallel worker's collection (importing torch is 1.6 s of CPU)."""
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            return
    pytest.skip(
        "needs a PyTorch built without CUDA (pip install torch --index-url "
        "https://download.pytorch.org/whl/cpu): a CUDA build may see a GPU"
    )


def test_the_api_shows_it_and_the_split_search_leaves_the_trials_out(tmp_path: Path) -> None:
    settings = Settings(
        home=tmp_path / "home",
        url=f"http://127.0.0.1:{free_port()}",
        simulated_gpu="h200-torch-mlp",
        # Two trials at once whatever this host has, so that two trials run in one round; a
        # short window, so that a point would be measured within the trials' lives.
        host_cores=2,
        split_settle=0,
        split_window=1,
    )
    with (
        embedded(settings) as daemon,
        httpx.Client(
            base_url=daemon.url, timeout=30, headers=daemon_bearer(settings.home)
        ) as client,
    ):
        created = client.post(
            "/sweeps",
            json={
                "params": ["steps=400,401"],
                # Each trial reports its optimizer steps for 6 s: rates the search would measure.
                "command": [sys.executable, LOOP, "{steps}", "6"],
                "workdir": str(tmp_path),
                "env": dict(os.environ),
                "split": "auto",
            },
        ).json()
        deadline = time.monotonic() + DEADLINE_S
        while (sweep := client.get(f"/sweeps/{created['id']}").json())["status"] != "finished":
            assert time.monotonic() < deadline, f"sweep did not finish: {sweep}"
            time.sleep(0.2)
        trials = client.get(f"/sweeps/{created['id']}/trials").json()["data"]
        assert [t["status"] for t in trials] == ["succeeded"] * 2, [t["error"] for t in trials]
        assert all(t["device"].startswith("GPU-") for t in trials), trials
        assert [t["no_gpu"] for t in trials] == ["torch"] * 2
        # The steps were counted (the search would have had rates), and not measured.
        assert all(t["steps_per_s"] for t in trials), trials
        assert sweep["no_gpu"] == [{"framework": "torch", "trials": 2, "fix": NO_GPU_FIX["torch"]}]
        [profile] = sweep["profiles"]
        assert profile["curve"] == [] and not profile["settled"], profile
        assert "torch sees no GPU" in profile["reason"], profile
        trial = client.get(f"/trials/{trials[0]['id']}").json()
        assert trial["no_gpu"] == "torch"


def test_gpumux_sweep_says_it_once(tmp_path: Path) -> None:
    (tmp_path / "tmp").mkdir()
    env = {name: value for name, value in os.environ.items() if not name.startswith("GPUMUX_")}
    env.update(
        GPUMUX_HOME=str(tmp_path / "home"),
        GPUMUX_SIMULATED_GPU="h200-torch-mlp",
        TMPDIR=str(tmp_path / "tmp"),
        COLUMNS="400",
    )
    result = subprocess.run(
        [sys.executable, "-m", "gpumux", "sweep", "steps=100,101", "--split", "2"]
        + ["--", sys.executable, LOOP, "{steps}", "2"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    warnings = [line for line in result.stdout.splitlines() if "sees no GPU" in line]
    assert warnings == [
        "WARNING: torch sees no GPU in trial(s) gpumux placed on a GPU: they train on the CPU, "
        f"and the split search leaves them out. To use the GPU, install {NO_GPU_FIX['torch']}"
    ], result.stdout
