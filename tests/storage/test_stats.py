"""Counts and durations over the whole database, as /health and the metrics scrape read them."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from builders import sweep_plan

from gpumux.status import SweepStatus, TrialStatus
from gpumux.storage import lifecycle, stats
from gpumux.storage import owners as owner_store
from gpumux.storage import sweeps as sweep_store
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import utcnow

T0 = utcnow() - timedelta(hours=1)


def test_an_empty_database_counts_zero_in_every_state(sessions: Sessions) -> None:
    with sessions.read() as session:
        assert stats.trials_by_status(session=session) == dict.fromkeys(TrialStatus, 0)
        assert stats.sweeps_by_status(session=session) == dict.fromkeys(SweepStatus, 0)
        assert stats.device_loads(session=session) == {}
        empty = stats.queue_waits(session=session, dialect=sessions.dialect, bounds=(1, 10))
        assert empty == stats.Histogram(counts=(0, 0, 0), total=0.0)


def test_counts_waits_durations_and_loads_of_trials_in_their_states(
    sessions: Sessions, tmp_path: Path
) -> None:
    # (final status, seconds queued before it started, seconds it ran, device, split, samples/s)
    plans = [
        (TrialStatus.succeeded, 0.5, 30.0, "gpu:0", 2, None),
        (TrialStatus.failed, 5.0, 300.0, "gpu:0", 2, None),
        (TrialStatus.running, 20.0, None, "gpu:0", 3, 40.0),
        (TrialStatus.running, 1.0, None, "gpu:1", 1, 60.0),
        (TrialStatus.starting, 12.0, None, "gpu:1", 4, None),
        (TrialStatus.queued, None, None, None, None, None),
    ]
    with sessions.write.begin() as session:
        owner = owner_store.get_or_create_owner(session=session, name="alice")
        sweep = sweep_store.create_sweep(
            session=session,
            plan=sweep_plan(tmp_path, seed=1, trial_params=[{"n": n} for n in range(len(plans))]),
            owner=owner,
        )
        trials, _ = trial_store.list_trials(session=session, sweep_id=sweep.id)
        for trial, (status, wait, ran, device, split, rate) in zip(trials, plans, strict=True):
            trial.queued_at = T0
            if wait is None:
                continue
            started = T0 + timedelta(seconds=wait)
            move = lifecycle.set_trial_status
            move(
                session=session,
                trial=trial,
                status=TrialStatus.starting,
                started_at=started,
                device=device,
                split=split,
            )
            if status is not TrialStatus.starting:
                move(session=session, trial=trial, status=TrialStatus.running, samples_per_s=rate)
            if ran is not None:
                ended = started + timedelta(seconds=ran)
                move(session=session, trial=trial, status=status, ended_at=ended)
        lifecycle.refresh_sweep_status(session=session, sweep=sweep)

    with sessions.read() as session:
        by_status = stats.trials_by_status(session=session)
        assert by_status == dict.fromkeys(TrialStatus, 0) | {
            TrialStatus.succeeded: 1,
            TrialStatus.failed: 1,
            TrialStatus.running: 2,
            TrialStatus.starting: 1,
            TrialStatus.queued: 1,
        }
        assert stats.sweeps_by_status(session=session)[SweepStatus.running] == 1
        waits = stats.queue_waits(session=session, dialect=sessions.dialect, bounds=(1, 10))
        assert waits.counts == (2, 1, 2) and abs(waits.total - 38.5) < 1e-3
        runs = stats.run_durations(session=session, dialect=sessions.dialect, bounds=(60,))
        assert runs.counts == (1, 1) and abs(runs.total - 330.0) < 1e-3
        assert stats.device_loads(session=session) == {
            "gpu:0": stats.DeviceLoad(trials=1, samples_per_s=40.0, split=3),
            "gpu:1": stats.DeviceLoad(trials=2, samples_per_s=60.0, split=4),
        }


def test_a_wait_of_exactly_a_bound_counts_in_that_bound_whatever_the_start(
    sessions: Sessions, tmp_path: Path
) -> None:
    # julianday's day fraction put a 1 s wait at 0.99999 or 1.00001 s depending on the clock.
    starts = [T0 + timedelta(microseconds=137_911 * n) for n in range(40)]
    with sessions.write.begin() as session:
        owner = owner_store.get_or_create_owner(session=session, name="alice")
        sweep = sweep_store.create_sweep(
            session=session,
            plan=sweep_plan(tmp_path, seed=1, trial_params=[{"n": n} for n in range(len(starts))]),
            owner=owner,
        )
        trials, _ = trial_store.list_trials(session=session, sweep_id=sweep.id)
        for trial, queued in zip(trials, starts, strict=True):
            trial.queued_at = queued
            lifecycle.set_trial_status(
                session=session,
                trial=trial,
                status=TrialStatus.starting,
                started_at=queued + timedelta(seconds=1),
                device="cpu:0",
                split=1,
            )
    with sessions.read() as session:
        waits = stats.queue_waits(session=session, dialect=sessions.dialect, bounds=(1,))
    assert waits.counts == (len(starts), 0) and waits.total == len(starts)
