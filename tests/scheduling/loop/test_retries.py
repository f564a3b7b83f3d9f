"""Retries: a failing trial rerun then failed, a start with no retry left, out of memory under an
automatic and a fixed split."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from gpumux.config import Settings
from gpumux.status import TrialStatus
from gpumux.storage import lifecycle
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions

from .support import (
    FIXTURES,
    Harness,
)


def test_a_starting_trial_with_no_retries_left_is_lost_at_start(
    harness: Harness, settings: Settings
) -> None:
    sweep_id = harness.submit(command=["true"])
    with harness.sessions.write.begin() as session:
        trial = trial_store.list_trials(session=session, sweep_id=sweep_id)[0][0]
        trial.attempt = settings.lost_retries + 1
        lifecycle.set_trial_status(session=session, trial=trial, status=TrialStatus.starting)
    harness.scheduler.reconcile()
    (trial,) = harness.trials(sweep_id)
    assert trial.status == TrialStatus.lost
    assert trial.error is not None and "no retries left" in trial.error


def test_an_auto_trial_out_of_memory_is_requeued_not_failed(harness: Harness) -> None:
    sweep_id = harness.submit(command=[sys.executable, str(FIXTURES / "oom_once.py")])
    asyncio.run(harness.scheduler.run_until_idle())
    (trial,) = harness.trials(sweep_id)
    assert trial.status == TrialStatus.succeeded and trial.attempt == 2
    (search,) = harness.scheduler.searches
    # The first attempt ran at the search's start; the search stays below it from there on.
    assert search.oom_at == search.start and search.split < search.start
    assert trial.error == (
        f"attempt 1 ran out of device memory at N={search.start}; requeued at a lower N"
    )


def test_a_fixed_split_trial_out_of_memory_fails_and_says_what_to_change(harness: Harness) -> None:
    sweep_id = harness.submit(command=[sys.executable, str(FIXTURES / "oom_once.py")], split=2)
    asyncio.run(harness.scheduler.run_until_idle())
    (trial,) = harness.trials(sweep_id)
    assert trial.status == TrialStatus.failed and trial.error is not None
    assert trial.error.startswith("out of device memory at N=2 (exited with code 1)")
    assert "try a smaller --split" in trial.error


def test_an_auto_trial_always_out_of_memory_fails_after_its_retry_budget(
    settings: Settings, sessions: Sessions, tmp_path: Path
) -> None:
    settings = settings.model_copy(update={"oom_retries": 2})
    harness = Harness(settings, sessions, tmp_path)
    sweep_id = harness.submit(command=[sys.executable, str(FIXTURES / "oom_always.py")])
    asyncio.run(harness.scheduler.run_until_idle())
    (trial,) = harness.trials(sweep_id)
    assert trial.status == TrialStatus.failed and trial.attempt == settings.oom_retries + 1
    assert trial.error is not None
    assert f"on each of {trial.attempt} attempts" in trial.error
    assert "lower its memory use (batch size, model), run it with --split 1" in trial.error


def test_retries_rerun_a_failing_trial_and_then_record_its_failure(harness: Harness) -> None:
    sweep_id = harness.submit(command=[sys.executable, "-c", "raise SystemExit(4)"], retries=2)
    asyncio.run(harness.scheduler.run_until_idle())
    (trial,) = harness.trials(sweep_id)
    assert (trial.status, trial.attempt, trial.failures, trial.exit_code) == (
        TrialStatus.failed,
        3,
        2,
        4,
    )
