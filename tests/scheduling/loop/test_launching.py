"""The scheduler launches trials: no more at once than the split, each with its contract; a command
that cannot start, or a log that cannot be written, fails that trial alone."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from gpumux.config import Settings
from gpumux.status import SweepStatus, TrialStatus

from .support import (
    FIXTURES,
    Harness,
)


def test_split_2_never_runs_more_than_2_at_once(harness: Harness) -> None:
    work = "import time, sys; time.sleep(0.3)"
    sweep_id = harness.submit("x=1..6", command=[sys.executable, "-c", work], split=2)
    asyncio.run(harness.scheduler.run_until_idle())
    trials = harness.trials(sweep_id)
    assert {t.status for t in trials} == {TrialStatus.succeeded}
    events = sorted(
        [(t.started_at, 1) for t in trials] + [(t.ended_at, -1) for t in trials],
        key=lambda event: (event[0], event[1]),
    )
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    assert peak == 2, f"peak concurrency {peak}"
    assert {t.slot for t in trials} == {0, 1}
    assert harness.sweep_status(sweep_id) == SweepStatus.finished


def test_the_trial_contract_reaches_the_process(harness: Harness, tmp_path: Path) -> None:
    os.environ["SUBMITTER_MARK"] = "from-the-submitter"
    try:
        sweep_id = harness.submit(
            "lr=1e-3..1e-1:3",
            "opt=adam",
            command=[sys.executable, str(FIXTURES / "echo_env.py"), "--opt-is={opt}"],
            split=2,
        )
    finally:
        del os.environ["SUBMITTER_MARK"]
    asyncio.run(harness.scheduler.run_until_idle())
    trial = harness.trials(sweep_id)[0]
    assert trial.status == TrialStatus.succeeded and trial.log_path is not None
    output = json.loads(Path(trial.log_path).read_text().splitlines()[-1])
    assert output["argv"] == ["--opt-is=adam", "--lr=0.001"]
    assert output["cwd"] == str(tmp_path)
    env = output["env"]
    assert env["SUBMITTER_MARK"] == "from-the-submitter"
    assert env["GPUMUX_TRIAL_ID"] == str(trial.id) and env["GPUMUX_SWEEP_ID"] == str(sweep_id)
    assert json.loads(env["GPUMUX_PARAMS"]) == {"lr": 0.001, "opt": "adam"}
    assert env["GPUMUX_SPLIT"] == "2" and env["GPUMUX_CPU_THREADS"] == env["OMP_NUM_THREADS"]
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["GPUMUX_DEVICE_KIND"] == "cpu"
    assert env["PYTHONPATH"].split(os.pathsep)[0].endswith("gpumux/runtime/bootstrap")
    assert len(env["GPUMUX_TRIAL_TOKEN"]) > 30 and env["GPUMUX_URL"] == "http://127.0.0.1:9"


def test_a_command_that_cannot_start_fails_with_the_reason(harness: Harness) -> None:
    sweep_id = harness.submit("x=1,2", command=["no-such-program-gpumux"], split=2)
    asyncio.run(harness.scheduler.run_until_idle())
    for trial in harness.trials(sweep_id):
        assert trial.status == TrialStatus.failed
        assert (
            trial.error is not None and "command not found: 'no-such-program-gpumux'" in trial.error
        )


def test_a_trial_whose_log_cannot_be_written_fails_and_the_rest_run_on(
    harness: Harness, settings: Settings
) -> None:
    blocked = harness.submit("x=1,2", command=["true"], split=2)
    settings.layout.logs.mkdir(parents=True)
    (settings.layout.logs / f"sweep-{blocked}").write_text("a file where a directory should be")
    fine = harness.submit("x=1,2", command=["true"], split=2)
    asyncio.run(harness.scheduler.run_until_idle())
    for trial in harness.trials(blocked):
        assert trial.status == TrialStatus.failed
        assert trial.error is not None and "cannot write the trial's log" in trial.error
    assert [t.status for t in harness.trials(fine)] == [TrialStatus.succeeded] * 2
