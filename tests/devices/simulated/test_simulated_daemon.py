"""Simulated trials on the simulated H200, through a real daemon: their rates are the model's,
NVML shows their memory, and a trial beyond its slice is recorded as out of memory."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from builders import simulated_sweep

from gpumux.client import Client
from gpumux.config import Settings
from gpumux.devices.simulated.state import load_model
from gpumux.devices.simulated.trial import TICK_S
from gpumux.schemas.sweeps import SweepDetail
from gpumux.server.daemon import embedded

MODEL = "h200-torch-mlp"
SCALE = 0.1
# Past the N where one trial alone is as fast as a few (the H200 scales linearly to 3).
SPLIT = 8
POLL_S = 0.2


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    settings = Settings(
        home=tmp_path / "home",
        simulated_gpu=MODEL,
        simulated_time_scale=SCALE,
        poll_interval=POLL_S,
        kill_grace=2.0,
    )
    with embedded(settings) as daemon, Client(daemon.url) as client:
        yield client


def run(client: Client, *, trials: int, split: int, args: list[str]) -> SweepDetail:
    sweep_id = simulated_sweep(client, trials=trials, split=split, args=args)
    deadline = time.monotonic() + 120
    while (sweep := client.get_sweep(sweep_id)).status != "finished":
        assert time.monotonic() < deadline, f"sweep did not finish: {sweep}"
        time.sleep(0.1)
    return sweep


def test_simulated_trials_compute_at_the_models_rate_and_show_its_memory(
    client: Client,
) -> None:
    model = load_model(MODEL)
    # Epochs of about 2 real seconds at N=8, so that one tick is a small part of one, and
    # longer than the trials take to start one after the other.
    epoch = 10 * model.epoch_samples
    args = ["--epochs=3", f"--epoch-samples={epoch}"]
    sweep_id = simulated_sweep(client, trials=SPLIT, split=SPLIT, args=args)
    deadline = time.monotonic() + 120
    seen_memory = 0
    while (sweep := client.get_sweep(sweep_id)).status != "finished":
        assert time.monotonic() < deadline, f"sweep did not finish: {sweep}"
        (device,) = client.devices()
        seen_memory = max(seen_memory, device.memory_used_mb or 0)
        time.sleep(0.1)
    trials = client.all_trials(sweep_id)
    assert [t.status for t in trials] == ["succeeded"] * SPLIT
    # NVML showed the trials' per-process memory, as a real GPU shows its processes'.
    assert seen_memory == SPLIT * model.per_process_mb
    # In their middle epoch all of them compute, but for a trial that started or ended a
    # little apart from the others (two fewer at most), give or take one tick of the trial's
    # clock, in which it may not yet have seen a trial start or end. The epochs' ends are the
    # trial's own (its log), not the daemon's stamps on the reports, a poll late or more.
    rates = [model.per_trial(n) for n in (SPLIT - 2, SPLIT)]
    middles, slacks = [], []
    for trial in trials:
        reports = client.all_reports(trial.id)
        assert [r.step for r in reports] == [0, 1, 2]
        assert sum(r.samples or 0 for r in reports) == 3 * epoch
        ends = epoch_ends(client.get_log(trial.id, offset=0).data)
        assert sorted(ends) == [0, 1, 2]
        seconds = ends[1] - ends[0]
        slack = TICK_S / seconds
        middles.append(epoch / seconds * SCALE)
        slacks.append(slack)
        assert min(rates) * (1 - slack) <= middles[-1] <= max(rates) * (1 + slack), (
            trial.id,
            seconds,
        )
    # Most computed their middle epoch beside all the others.
    assert statistics.median(middles) == pytest.approx(model.per_trial(SPLIT), rel=max(slacks))


def epoch_ends(log: str) -> dict[int, float]:
    """When each epoch ended on the simulated trial's clock, from its log."""
    return {
        int(match["step"]): float(match["at"])
        for match in re.finditer(r"^epoch (?P<step>\d+) ended at (?P<at>[\d.]+) s", log, re.M)
    }


def test_a_trial_beyond_its_slice_runs_out_of_memory(client: Client) -> None:
    model = load_model(MODEL)
    # At N=3 a slice is about a third of the card: a trial holding half of it does not fit.
    sweep = run(
        client, trials=1, split=3, args=["--epochs=1", f"--memory-mb={model.memory_mb // 2}"]
    )
    (trial,) = client.all_trials(sweep.id)
    assert trial.status == "failed"
    assert trial.error is not None
    assert "out of device memory at N=3" in trial.error
    assert "torch.OutOfMemoryError: CUDA out of memory" in trial.error
    (device,) = client.devices()
    assert device.memory_used_mb == 0
