"""A window's per-trial rates: life rates read at one age, whatever each trial's age."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from builders import sweep_plan
from sqlalchemy.orm import Session

from gpumux.splits.window import Timing, trial_rates
from gpumux.status import TrialStatus
from gpumux.storage import owners as owner_store
from gpumux.storage import sweeps as sweep_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Trial, TrialReport, utcnow
from gpumux.throughput import SAMPLES_PER_S

TIMING = Timing(settle=timedelta(seconds=5), window=timedelta(seconds=10))
NUMBERS = itertools.count(100)
# The workload: 4 s of start-up, then 20 samples every 2 s.
STARTUP_S = 4.0
EPOCH_S = 2.0
EPOCH_SAMPLES = 20.0


def a_sweep(sessions: Sessions, tmp_path: Path) -> int:
    with sessions.write.begin() as session:
        sweep = sweep_store.create_sweep(
            session=session,
            plan=sweep_plan(tmp_path, "x=1..9", command=["python", "train.py"], seed=1),
            owner=owner_store.get_or_create_owner(session=session, name="alice"),
        )
        return sweep.id


def epochs(began: datetime, until: datetime, startup_s: float = STARTUP_S) -> list[datetime]:
    """When a trial that started at `began` reports an epoch: every `EPOCH_S` after its
    start-up, up to `until`."""
    first = began + timedelta(seconds=startup_s + EPOCH_S)
    count = int((until - first) / timedelta(seconds=EPOCH_S)) + 1
    return [first + timedelta(seconds=EPOCH_S * n) for n in range(count)]


def add_trial(
    session: Session, sweep_id: int, began: datetime, reports: Sequence[datetime]
) -> Trial:
    """A trial of the sweep under N=3 since `began`, an epoch's samples reported at each of
    `reports`."""
    trial = Trial(
        sweep_id=sweep_id,
        number=next(NUMBERS),
        params={},
        status=TrialStatus.running,
        device="cpu",
        split=3,
        started_at=began,
    )
    session.add(trial)
    session.flush()
    session.add_all(
        TrialReport(
            trial_id=trial.id,
            attempt=1,
            kind="line",
            at=at,
            samples=EPOCH_SAMPLES,
            seconds=EPOCH_S,
            metrics={},
        )
        for at in reports
    )
    session.flush()
    return trial


def rates_of(session: Session, trials: list[Trial], start: datetime) -> list[float]:
    """The rates of the window opened at `start`, read as it closes."""
    found = trial_rates(
        session=session,
        trials=trials,
        start=start,
        end=start + TIMING.window,
        unit=SAMPLES_PER_S,
        timing=TIMING,
    )
    return [found[trial.id] for trial in trials]


@pytest.mark.parametrize("ages", [(30, 12, 2), (9, 7, 6)])
def test_trials_of_different_ages_read_alike(
    sessions: Sessions, tmp_path: Path, ages: tuple[int, ...]
) -> None:
    sweep_id = a_sweep(sessions, tmp_path)
    start = utcnow()
    end = start + TIMING.window
    with sessions.write.begin() as session:
        # The oldest started beside the last N's trials, long before the others.
        began = [start - timedelta(seconds=age) for age in ages]
        trials = [add_trial(session, sweep_id, at, epochs(at, end)) for at in began]
        rates = rates_of(session, trials, start)
    # Each over the youngest's life at its last report: its start-up, then its epochs.
    youngest = (end - began[-1]).total_seconds() // EPOCH_S * EPOCH_S
    epochs_then = (youngest - STARTUP_S) // EPOCH_S
    assert rates == [pytest.approx(epochs_then * EPOCH_SAMPLES / youngest)] * len(ages)


def test_a_crowded_start_up_still_counts(sessions: Sessions, tmp_path: Path) -> None:
    sweep_id = a_sweep(sessions, tmp_path)
    start = utcnow()
    end = start + TIMING.window
    began = start - timedelta(seconds=6)
    with sessions.write.begin() as session:
        # Started together, one slowed down by the other trials' start-up.
        quick = add_trial(session, sweep_id, began, epochs(began, end))
        crowded = add_trial(session, sweep_id, began, epochs(began, end, 8.0))
        rates = rates_of(session, [quick, crowded], start)
    # Both over 16 s of their lives: 6 epochs after 4 s of start-up, 4 after 8 s.
    assert rates == [pytest.approx(6 * EPOCH_SAMPLES / 16), pytest.approx(4 * EPOCH_SAMPLES / 16)]


def test_an_older_trial_is_read_between_its_reports_at_the_youngest_ones_age(
    sessions: Sessions, tmp_path: Path
) -> None:
    sweep_id = a_sweep(sessions, tmp_path)
    start = utcnow()
    end = start + TIMING.window
    with sessions.write.begin() as session:
        old_began, young_began = start - timedelta(seconds=30), start - timedelta(seconds=3)
        old = add_trial(session, sweep_id, old_began, epochs(old_began, end))
        # Its start-up took a second longer: it reports at 7, 9, 11 and 13 s of age.
        young = add_trial(session, sweep_id, young_began, epochs(young_began, end, 5.0))
        rates = rates_of(session, [old, young], start)
    # At 13 s of age the older one was half way from its 4th epoch (12 s) to its 5th (14 s).
    assert rates == [pytest.approx(4.5 * EPOCH_SAMPLES / 13), pytest.approx(4 * EPOCH_SAMPLES / 13)]
