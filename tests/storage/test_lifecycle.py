"""Each status move the scheduler makes, as storage records it: what the trial's row gets."""

from __future__ import annotations

import signal
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from builders import stored_sweep
from sqlalchemy.orm import Session

from gpumux.status import PruneNote, SweepStatus, TrialStatus
from gpumux.storage import lifecycle
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Trial, token_hash, utcnow


def queued(session: Session, tmp_path: Path, **sweep_fields: Any) -> Trial:
    """The one trial of a stored sweep (with `sweep_fields`), queued."""
    sweep = stored_sweep(session, tmp_path, 1, **sweep_fields)
    return trial_store.list_trials(session=session, sweep_id=sweep.id)[0][0]


def launch(session: Session, trial: Trial, tmp_path: Path, token: str = "secret") -> None:
    lifecycle.record_launch(
        session=session,
        trial=trial,
        node_id=None,
        device="cpu",
        slot=0,
        split=2,
        memory_limit_mb=None,
        cpu_threads=1,
        token=token,
        log_path=str(tmp_path / f"{trial.id}.{trial.attempt}.log"),
    )


def second_attempt(session: Session, tmp_path: Path, **sweep_fields: Any) -> Trial:
    """A trial running its second attempt: the first was cut off and requeued, which its error
    still says."""
    trial = queued(session, tmp_path, **sweep_fields)
    launch(session, trial, tmp_path)
    lifecycle.record_started(session=session, trial=trial, pid=4321, pid_started=99)
    lifecycle.requeue(session=session, trial=trial, why="was cut off", then="requeued")
    launch(session, trial, tmp_path)
    lifecycle.record_started(session=session, trial=trial, pid=4322, pid_started=100)
    return trial


REQUEUED = "attempt 1 was cut off; requeued"
# A sweep with a pruner (which needs an objective to judge).
PRUNED: dict[str, Any] = {"prune": "median", "objective": "val_loss:min"}
NOTE = str(PruneNote(step=2, pruner="median", metric="val_loss", value=0.7))


def test_a_trial_that_ended_before_its_start_was_recorded_ran_first(
    sessions: Sessions, tmp_path: Path
) -> None:
    with sessions.write.begin() as session:
        trial = queued(session, tmp_path)
        launch(session, trial, tmp_path)
        started = trial.started_at
        lifecycle.record_ran(session=session, trial=trial)
        assert (trial.status, trial.started_at) == (TrialStatus.running, started)
        # A trial whose start was recorded stays as it is.
        lifecycle.record_ran(session=session, trial=trial)
        assert trial.status is TrialStatus.running


@pytest.mark.parametrize("launch_time_known", [True, False])
def test_an_adopted_trial_runs_since_its_launch(
    sessions: Sessions, tmp_path: Path, launch_time_known: bool
) -> None:
    with sessions.write.begin() as session:
        trial = queued(session, tmp_path)
        launch(session, trial, tmp_path)
        launched = utcnow() - timedelta(hours=1)
        trial.started_at = launched if launch_time_known else None
        before = utcnow()
        lifecycle.record_adopted(session=session, trial=trial)
        assert trial.status is TrialStatus.running and trial.started_at is not None
        if launch_time_known:
            assert trial.started_at == launched
        else:
            assert trial.started_at >= before


@pytest.mark.parametrize("launched", [False, True])
def test_a_trial_that_could_not_start_fails_with_the_reason(
    sessions: Sessions, tmp_path: Path, launched: bool
) -> None:
    with sessions.write.begin() as session:
        trial = queued(session, tmp_path)
        if launched:
            launch(session, trial, tmp_path)
        lifecycle.record_not_started(session=session, trial=trial, error="no such user: bob")
    with sessions.read() as session:
        stored = trial_store.get_trial(session=session, trial_id=trial.id)
        assert stored is not None
        assert (stored.status, stored.error) == (TrialStatus.failed, "no such user: bob")
        assert stored.ended_at is not None and stored.exit_code is None
        assert stored.sweep.status is SweepStatus.finished


# Each end: the move, what the sweep needs for it, and the status and error the trial gets
# (None: the error the first attempt's requeue left stays).
ENDS: list[tuple[str, Callable[..., None], dict[str, Any], TrialStatus, str | None]] = [
    ("succeeded", lifecycle.record_succeeded, {}, TrialStatus.succeeded, None),
    ("cancelled", lifecycle.record_cancelled, {}, TrialStatus.cancelled, None),
    (
        "pruned",
        lifecycle.record_pruned,
        PRUNED,
        TrialStatus.pruned,
        "pruned by the median pruner",
    ),
    (
        "timed out",
        lifecycle.record_timed_out,
        {"time_limit_s": 30},
        TrialStatus.failed,
        "time limit of 30 s exceeded; stopped",
    ),
]


@pytest.mark.parametrize(
    ("move", "sweep_fields", "status", "error"),
    [
        pytest.param(move, fields, status, error, id=name)
        for name, move, fields, status, error in ENDS
    ],
)
def test_each_end_records_its_status_exit_and_error(
    sessions: Sessions,
    tmp_path: Path,
    move: Callable[..., None],
    sweep_fields: dict[str, Any],
    status: TrialStatus,
    error: str | None,
) -> None:
    with sessions.write.begin() as session:
        trial = second_attempt(session, tmp_path, **sweep_fields)
        assert trial.error == REQUEUED
        before = utcnow()
        move(session=session, trial=trial, exit_code=None, signal=signal.SIGTERM)
        assert trial.ended_at is not None and trial.ended_at >= before
    with sessions.read() as session:
        stored = trial_store.get_trial(session=session, trial_id=trial.id)
        assert stored is not None
        assert (stored.status, stored.error) == (status, error or REQUEUED)
        assert (stored.exit_code, stored.signal) == (None, signal.SIGTERM)
        assert stored.sweep.status is SweepStatus.finished


def test_a_pruned_trial_keeps_the_note_its_pruner_left(sessions: Sessions, tmp_path: Path) -> None:
    with sessions.write.begin() as session:
        trial = second_attempt(session, tmp_path, **PRUNED)
        lifecycle.note_pruned(session=session, trial=trial, note=NOTE)
        lifecycle.record_pruned(session=session, trial=trial, exit_code=None, signal=15)
        assert (trial.status, trial.error) == (TrialStatus.pruned, NOTE)


def test_a_failed_trial_records_its_error_and_exit_status(
    sessions: Sessions, tmp_path: Path
) -> None:
    with sessions.write.begin() as session:
        trial = second_attempt(session, tmp_path)
        lifecycle.record_failed(
            session=session, trial=trial, error="exited with code 3", exit_code=3
        )
        assert (trial.status, trial.error) == (TrialStatus.failed, "exited with code 3")
        assert (trial.exit_code, trial.signal) == (3, None) and trial.ended_at is not None


@pytest.mark.parametrize("move", [move for _, move, _, _, _ in ENDS])
def test_an_end_the_lifecycle_does_not_allow_is_refused_and_changes_nothing(
    sessions: Sessions, tmp_path: Path, move: Callable[..., None]
) -> None:
    with sessions.write.begin() as session:
        trial = queued(session, tmp_path, **PRUNED, time_limit_s=30)
        lifecycle.record_not_started(session=session, trial=trial, error="no such user: bob")
        ended = trial.ended_at
        # An ended trial ends no more: a late or repeated end is refused.
        with pytest.raises(lifecycle.IllegalTransition, match="failed -> "):
            move(session=session, trial=trial, exit_code=0, signal=None)
        assert (trial.status, trial.error) == (TrialStatus.failed, "no such user: bob")
        assert (trial.exit_code, trial.ended_at) == (None, ended)


def test_a_launch_clears_what_the_last_attempt_left(sessions: Sessions, tmp_path: Path) -> None:
    with sessions.write.begin() as session:
        trial = queued(session, tmp_path)
        launch(session, trial, tmp_path, token="first")
        lifecycle.record_started(session=session, trial=trial, pid=4321, pid_started=99)
        # What the first attempt reached before it was cut off, as its reports and end left it.
        trial.step, trial.objective, trial.log_scanned = 7, 0.25, 512
        trial.exit_code, trial.signal = 137, 9
        trial.pool_mb, trial.pool_at = 4096, utcnow()
        trial.started_at = first_start = utcnow() - timedelta(hours=1)
        lifecycle.requeue(session=session, trial=trial, why="was cut off", then="requeued")
        launch(session, trial, tmp_path, token="second")
        assert trial.started_at is not None and trial.started_at > first_start
    with sessions.read() as session:
        stored = trial_store.get_trial(session=session, trial_id=trial.id)
        assert stored is not None
        assert (stored.status, stored.attempt) == (TrialStatus.starting, 2)
        assert stored.token_hash == token_hash("second")
        assert stored.log_path == str(tmp_path / f"{stored.id}.2.log") and stored.log_scanned == 0
        left = (stored.step, stored.objective, stored.exit_code, stored.signal)
        assert left == (None, None, None, None)
        assert (stored.pid, stored.pid_started) == (None, None)
        assert (stored.pool_mb, stored.pool_at) == (None, None)
