"""A window's per-trial rates: the phase's trials' life rates read at one age, whatever each
one's age; a refill at its own, a trial older than the phase left out."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from builders import sweep_plan
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpumux.splits.window import (
    Computing,
    Steady,
    Timing,
    Window,
    measure,
    phase_window,
    steady_readings,
    sweep_fingerprint,
    trial_rates,
)
from gpumux.status import TrialStatus
from gpumux.storage import owners as owner_store
from gpumux.storage import reports as report_store
from gpumux.storage import sweeps as sweep_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Sweep, Trial, TrialReport, utcnow
from gpumux.throughput import SAMPLES_PER_S, TRIALS_PER_S, ThroughputUnit

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


def add_reports(session: Session, trial: Trial, at: Sequence[datetime], samples: float) -> None:
    session.add_all(
        TrialReport(
            trial_id=trial.id,
            attempt=1,
            kind="line",
            at=when,
            samples=samples,
            seconds=EPOCH_S,
            metrics={},
        )
        for when in at
    )
    session.flush()


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
    add_reports(session, trial, reports, EPOCH_SAMPLES)
    return trial


def rates_of(session: Session, trials: list[Trial], start: datetime) -> list[float]:
    """The rates of the window opened at `start`, read as it closes."""
    found = trial_rates(
        session=session,
        trials=trials,
        # The phase began a settle time before the window opened.
        phase_start=start - TIMING.settle,
        start=start,
        end=start + TIMING.window,
        unit=SAMPLES_PER_S,
        timing=TIMING,
    )
    return [found[trial.id] for trial in trials]


@pytest.mark.parametrize("ages", [(8, 5, 2), (9, 7, 6)])
def test_trials_of_different_ages_read_alike(
    sessions: Sessions, tmp_path: Path, ages: tuple[int, ...]
) -> None:
    sweep_id = a_sweep(sessions, tmp_path)
    start = utcnow()
    end = start + TIMING.window
    with sessions.write.begin() as session:
        # The oldest started in the tick the phase began, the others in its settle time.
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


def test_each_trial_shows_its_steady_rate_and_its_start_up_whatever_its_age(
    sessions: Sessions, tmp_path: Path
) -> None:
    sweep_id = a_sweep(sessions, tmp_path)
    start = utcnow()
    end = start + TIMING.window
    with sessions.write.begin() as session:
        young, old = (start - timedelta(seconds=age) for age in (3, 30))
        trials = [
            add_trial(session, sweep_id, young, epochs(young, end)),
            add_trial(session, sweep_id, old, epochs(old, end)),
            # Slowed down by others starting: its start-up is its own.
            add_trial(session, sweep_id, young, epochs(young, end, 7.0)),
            # Its first two epochs read in one tick (a buffered output): that tick's spacing is
            # the reading's, so its rate is taken from the tick on.
            add_trial(
                session,
                sweep_id,
                young,
                [*[young + timedelta(seconds=8)] * 2, *epochs(young, end)[2:]],
            ),
            # Its epochs all read in one tick: no span to take a rate over.
            add_trial(session, sweep_id, young, [end, end]),
        ]
        readings = steady_readings(
            session=session,
            trials=trials,
            ids={t.id for t in trials},
            end=end,
            unit=SAMPLES_PER_S,
        )
    # An epoch's samples every 2 s after each one's start-up, however long it has run since.
    rate = EPOCH_SAMPLES / EPOCH_S
    assert all(isinstance(reading, Steady) for reading in readings)
    assert sorted((r.startup_s, r.rate) for r in readings) == [
        pytest.approx((STARTUP_S, rate)),
        pytest.approx((STARTUP_S, rate)),
        pytest.approx((STARTUP_S, rate)),
        pytest.approx((7.0, rate)),
    ]


def seconds(began: datetime, *offsets: float) -> list[datetime]:
    return [began + timedelta(seconds=offset) for offset in offsets]


def ended(trial: Trial, at: datetime) -> None:
    trial.ended_at, trial.status = at, TrialStatus.succeeded


def test_a_steady_rate_is_read_while_n_trials_computed_on_the_device(
    sessions: Sessions, tmp_path: Path
) -> None:
    sweep_id = a_sweep(sessions, tmp_path)
    began = utcnow()
    with sessions.write.begin() as session:
        # Two trials of the lower N it was raised from compute beside it, and end at 10 s.
        for _ in range(2):
            lower = add_trial(session, sweep_id, began - timedelta(seconds=30), [began])
            lower.split = 2
            ended(lower, began + timedelta(seconds=10))
        # N=3's own trial: 4 s of start-up, then an epoch every 2 s beside them; alone after
        # they ended, twice as fast.
        trial = add_trial(session, sweep_id, began, seconds(began, 6, 8, 10))
        add_reports(session, trial, seconds(began, 12, 14, 16), 2 * EPOCH_SAMPLES)
        end = began + timedelta(seconds=16)
        spans = report_store.computing_spans(session=session, device="cpu", since=began, end=end)

        def read(computing: Computing | None) -> list[tuple[float, float, bool]]:
            steady = steady_readings(
                session=session,
                trials=[trial],
                ids={trial.id},
                end=end,
                unit=SAMPLES_PER_S,
                computing=computing,
            )
            return [(r.rate, r.startup_s, r.beside_n) for r in steady]

        full = read(Computing(split=3, spans=spans, least=3.0))
        never = read(Computing(split=4, spans=spans, least=3.0))
        brief = read(Computing(split=3, spans=spans, least=5.0))
        unbounded = read(None)
    rate = EPOCH_SAMPLES / EPOCH_S
    # While 3 computed: an epoch every 2 s. Its start-up, 6 s to its first report less that
    # report's epoch at the pace of the next, whatever the rate.
    assert full == [pytest.approx((rate, STARTUP_S, True))]
    # There for 4 s only, short of the 5 a rate needs: over all its reports.
    assert brief == never
    # Never 4 at once: over all its reports, 2 of the 5 spans between them at that rate, 3 at
    # twice it; as it is without the device's spans.
    blended = (2 + 3 * 2) * EPOCH_SAMPLES / (5 * EPOCH_S)
    assert never == [pytest.approx((blended, STARTUP_S, False))]
    assert unbounded == [pytest.approx((blended, STARTUP_S, True))]


def raised_phase(session: Session, sweep_id: int, phase_start: datetime) -> Trial:
    """N=3 raised from 2: the lower N's two trials end 6 s into the phase, together; its own
    trial, started with it, then computes alone, twice as fast, until their refills (started
    then, 8 s of start-up) compute beside it from 16 s. Returns a refill."""
    for _ in range(2):
        lower = add_trial(session, sweep_id, phase_start - timedelta(seconds=30), [phase_start])
        lower.split = 2
        ended(lower, phase_start + timedelta(seconds=6))
    own = add_trial(session, sweep_id, phase_start, seconds(phase_start, 6))
    add_reports(session, own, seconds(phase_start, 8, 10, 12, 14, 16), 2 * EPOCH_SAMPLES)
    add_reports(session, own, seconds(phase_start, 18, 20, 22), EPOCH_SAMPLES)
    refill_began = phase_start + timedelta(seconds=6)
    refills = [
        add_trial(session, sweep_id, refill_began, epochs(refill_began, refill_began, 8.0))
        for _ in range(2)
    ]
    return refills[0]


def window_at(
    session: Session, sweep_id: int, phase_start: datetime, now: float, *, alone: bool = True
) -> Window | None:
    """The phase's window `now` seconds after it began (None: it does not close then)."""
    window, _ = closing_window(
        session,
        sweep_id,
        phase_start,
        unit=SAMPLES_PER_S,
        measured=False,
        now=phase_start + timedelta(seconds=now),
        alone=alone,
    )
    return window


def test_a_raised_phase_whose_trial_computed_beside_fewer_than_n_waits_for_its_refills(
    sessions: Sessions, tmp_path: Path
) -> None:
    sweep_id = a_sweep(sessions, tmp_path)
    phase_start = utcnow()
    with sessions.write.begin() as session:
        refill = raised_phase(session, sweep_id, phase_start)
        for one in session.scalars(select(Trial).where(Trial.started_at == refill.started_at)):
            add_reports(session, one, seconds(phase_start, 16, 18, 20, 22), EPOCH_SAMPLES)
        # Its own trial reported twice in the window by 15 s, alone since 6 s.
        assert window_at(session, sweep_id, phase_start, 15) is None
        # Another workload's trials beside it would not be N: every span counts.
        assert window_at(session, sweep_id, phase_start, 15, alone=False) is not None
        # Three computed from 16 s: by 20 s, not for half a window (5 s) yet.
        assert window_at(session, sweep_id, phase_start, 20) is None
        window = window_at(session, sweep_id, phase_start, 22)
    # Three computed from 16 s: each trial read there, at an epoch every 2 s.
    assert window is not None
    assert [(r.rate, r.beside_n) for r in window.steady] == [
        pytest.approx((EPOCH_SAMPLES / EPOCH_S, True))
    ] * 3


def never_n(session: Session, sweep_id: int, phase_start: datetime) -> tuple[Trial, Trial]:
    """`raised_phase` where the device never held 3 computing: its own trial ends at 22 s, a
    refill at 13 s, before computing; the other refill runs on. Returns those two."""
    refill = raised_phase(session, sweep_id, phase_start)
    own = session.scalars(select(Trial).where(Trial.started_at == phase_start)).one()
    ended(own, phase_start + timedelta(seconds=22))
    ended(refill, phase_start + timedelta(seconds=13))
    session.flush()
    return own, refill


def test_a_raised_phase_that_never_had_n_computing_is_read_over_all_its_reports(
    sessions: Sessions, tmp_path: Path
) -> None:
    sweep_id = a_sweep(sessions, tmp_path)
    phase_start = utcnow()
    with sessions.write.begin() as session:
        never_n(session, sweep_id, phase_start)
        # Until the other refill, started before its own trial ended, ends too; or, where it
        # never gets past its start-up, until a life of its own trial (22 s) after that ended.
        assert window_at(session, sweep_id, phase_start, 23) is None
        assert window_at(session, sweep_id, phase_start, 43) is None
        stuck = window_at(session, sweep_id, phase_start, 44)
        for one in session.scalars(select(Trial).where(Trial.ended_at.is_(None))):
            ended(one, phase_start + timedelta(seconds=24))
        session.flush()
        window = window_at(session, sweep_id, phase_start, 24)
    rate = (5 * 2 + 3) * EPOCH_SAMPLES / (8 * EPOCH_S)
    for closed in (stuck, window):
        assert closed is not None
        assert [(r.rate, r.beside_n) for r in closed.steady] == [pytest.approx((rate, False))]


def test_a_workload_counted_in_trials_per_second_never_waits_for_n_computing(
    sessions: Sessions, tmp_path: Path
) -> None:
    sweep_id = a_sweep(sessions, tmp_path)
    phase_start = utcnow()
    with sessions.write.begin() as session:
        own, refill = never_n(session, sweep_id, phase_start)
        now = phase_start + timedelta(seconds=23)

        def at(unit: ThroughputUnit) -> Window | None:
            window, _ = closing_window(
                session, sweep_id, phase_start, unit=unit, measured=True, now=now
            )
            return window

        # As above, a rate in samples waits for the other refill; a count of trials has no
        # rate to read fast, and its phase's trial has ended.
        waits, counts = at(SAMPLES_PER_S), at(TRIALS_PER_S)
    assert waits is None
    assert counts is not None
    assert sorted(t.id for t in counts.ended) == sorted((own.id, refill.id))


def test_a_phase_with_no_trial_of_its_own_by_its_window_waits_for_none(
    sessions: Sessions, tmp_path: Path
) -> None:
    sweep_id = a_sweep(sessions, tmp_path)
    phase_start, start, end = phase_times()
    with sessions.write.begin() as session:
        # Two refills, started after the window opened with no start-up, compute beside each
        # other: never N=3.
        began = start + timedelta(seconds=1)
        reports = epochs(began, end, startup_s=0)
        for _ in range(2):
            add_trial(session, sweep_id, began, reports)
        window, _ = closing_window(
            session, sweep_id, phase_start, unit=SAMPLES_PER_S, measured=False
        )
    assert window is not None
    assert window.rates == [pytest.approx(life_rate(began, reports))] * 2
    assert [r.beside_n for r in window.steady] == [False, False]


def test_a_start_up_whose_next_reports_counted_nothing_is_taken_at_the_rate(
    sessions: Sessions, tmp_path: Path
) -> None:
    sweep_id = a_sweep(sessions, tmp_path)
    began = utcnow()
    end = began + timedelta(seconds=14)
    with sessions.write.begin() as session:
        # Its first epoch at 6 s; its next two reports count nothing (a line of metrics with
        # a count of 0), then an epoch every 2 s.
        trial = add_trial(session, sweep_id, began, seconds(began, 6, 12, 14))
        add_reports(session, trial, seconds(began, 8, 10), 0.0)
        (reading,) = steady_readings(
            session=session, trials=[trial], ids={trial.id}, end=end, unit=SAMPLES_PER_S
        )
    # Two epochs over the 8 s after the first: 5 samples/s; the first epoch's 20 samples at
    # that rate took 4 s of the 6.
    rate = 2 * EPOCH_SAMPLES / 8
    assert (reading.rate, reading.startup_s) == pytest.approx((rate, 6 - EPOCH_SAMPLES / rate))


def test_an_older_trial_is_read_between_its_reports_at_the_youngest_ones_age(
    sessions: Sessions, tmp_path: Path
) -> None:
    sweep_id = a_sweep(sessions, tmp_path)
    start = utcnow()
    end = start + TIMING.window
    with sessions.write.begin() as session:
        old_began, young_began = start - timedelta(seconds=9), start - timedelta(seconds=3)
        old = add_trial(session, sweep_id, old_began, epochs(old_began, end))
        # Its start-up took a second longer: it reports at 7, 9, 11 and 13 s of age.
        young = add_trial(session, sweep_id, young_began, epochs(young_began, end, 5.0))
        rates = rates_of(session, [old, young], start)
    # At 13 s of age the older one was half way from its 4th epoch (12 s) to its 5th (14 s).
    assert rates == [pytest.approx(4.5 * EPOCH_SAMPLES / 13), pytest.approx(4 * EPOCH_SAMPLES / 13)]


def closing_window(
    session: Session,
    sweep_id: int,
    phase_start: datetime,
    *,
    unit: ThroughputUnit,
    measured: bool,
    now: datetime | None = None,
    alone: bool = True,
) -> tuple[Window | None, ThroughputUnit]:
    """The window of the phase that began at `phase_start` on the CPU under N=3, read as it
    would close (or `now`; None: it does not close then), and the unit it is read in."""
    sweep = session.get(Sweep, sweep_id)
    assert sweep is not None
    window, read_in = phase_window(
        session=session,
        device="cpu",
        split=3,
        phase_start=phase_start,
        now=now or phase_start + TIMING.settle + TIMING.window,
        node_id=None,
        fingerprint=sweep_fingerprint(sweep),
        auto={},
        unit=unit,
        measured=measured,
        timing=TIMING,
        alone=alone,
    )
    assert window is None or isinstance(window, Window)
    return window, read_in


def phase_rates(session: Session, sweep_id: int, phase_start: datetime) -> list[float] | None:
    """The rates of that phase's window, in order (None: it does not close then)."""
    window, _ = closing_window(session, sweep_id, phase_start, unit=SAMPLES_PER_S, measured=False)
    return None if window is None else sorted(window.rates)


def phase_times() -> tuple[datetime, datetime, datetime]:
    """A phase begun now: its start, its window's opening (after the settle time), its end."""
    phase_start = utcnow()
    start = phase_start + TIMING.settle
    return phase_start, start, start + TIMING.window


def life_rate(began: datetime, reports: Sequence[datetime]) -> float:
    """A trial's samples over its life to its last report, as main reads every trial."""
    return len(reports) * EPOCH_SAMPLES / (reports[-1] - began).total_seconds()


def test_a_refill_started_after_the_window_opened_does_not_set_the_age(
    sessions: Sessions, tmp_path: Path
) -> None:
    sweep_id = a_sweep(sessions, tmp_path)
    phase_start, start, end = phase_times()
    with sessions.write.begin() as session:
        # Two of the phase's trials started with it; the third ended as the window opened and
        # its slot was refilled: the refill, with no start-up, reported twice in the window,
        # half a window apart at least.
        for _ in range(2):
            add_trial(session, sweep_id, phase_start, epochs(phase_start, end))
        refill_began = start + timedelta(seconds=1)
        add_trial(session, sweep_id, refill_began, epochs(refill_began, end, 0.0))
        rates = phase_rates(session, sweep_id, phase_start)
    # The phase's trials read at their own age (14 s: 5 epochs after 4 s of start-up), not
    # the refill's (8 s, when they had 2); the refill over its own life.
    assert rates == pytest.approx(
        sorted(
            [life_rate(phase_start, epochs(phase_start, end))] * 2
            + [life_rate(refill_began, epochs(refill_began, end, 0.0))]
        )
    )


def test_a_trial_that_started_before_its_phase_is_left_out(
    sessions: Sessions, tmp_path: Path
) -> None:
    sweep_id = a_sweep(sessions, tmp_path)
    phase_start, start, end = phase_times()
    with sessions.write.begin() as session:
        # Started beside the last N's wave, 30 s before the phase: read at the phase trials'
        # age (14 s), its whole reading would fall before the phase began.
        before = phase_start - timedelta(seconds=30)
        add_trial(session, sweep_id, before, epochs(before, end))
        for _ in range(2):
            add_trial(session, sweep_id, phase_start, epochs(phase_start, end))
        window, _ = closing_window(
            session, sweep_id, phase_start, unit=SAMPLES_PER_S, measured=False
        )
    # The phase's two alone, at their age (14 s), and their steady readings alone.
    assert window is not None
    assert window.rates == [pytest.approx(life_rate(phase_start, epochs(phase_start, end)))] * 2
    assert len(window.steady) == 2


def test_a_phase_whose_trials_all_started_before_it_reads_each_over_its_own_life(
    sessions: Sessions, tmp_path: Path
) -> None:
    sweep_id = a_sweep(sessions, tmp_path)
    phase_start, start, end = phase_times()
    with sessions.write.begin() as session:
        # Nothing refilled the phase (the sweep's queue was empty): its trials all started
        # beside the last N's, and each is read as main read it, over its own life.
        began = [phase_start - timedelta(seconds=age) for age in (30, 20, 12)]
        for at in began:
            add_trial(session, sweep_id, at, epochs(at, end))
        rates = phase_rates(session, sweep_id, phase_start)
    assert rates == pytest.approx(sorted(life_rate(at, epochs(at, end)) for at in began))


def test_a_phase_waits_for_its_own_trials_not_for_an_older_one(
    sessions: Sessions, tmp_path: Path
) -> None:
    sweep_id = a_sweep(sessions, tmp_path)
    phase_start = utcnow()
    end = phase_start + TIMING.settle + TIMING.window
    with sessions.write.begin() as session:
        before = phase_start - timedelta(seconds=30)
        add_trial(session, sweep_id, before, epochs(before, end))
        # The phase's own trial has not reported twice yet: the window stays open.
        add_trial(session, sweep_id, phase_start, epochs(phase_start, end)[:1])
        assert phase_rates(session, sweep_id, phase_start) is None


def test_a_phase_closes_on_its_own_trials_whatever_an_older_one_reported(
    sessions: Sessions, tmp_path: Path
) -> None:
    sweep_id = a_sweep(sessions, tmp_path)
    phase_start = utcnow()
    end = phase_start + TIMING.settle + TIMING.window
    with sessions.write.begin() as session:
        before = phase_start - timedelta(seconds=30)
        # The older trial has not reported twice in the window; the phase's own trials have.
        add_trial(session, sweep_id, before, epochs(before, end)[:-6])
        for _ in range(2):
            add_trial(session, sweep_id, phase_start, epochs(phase_start, end))
        rates = phase_rates(session, sweep_id, phase_start)
    assert rates == [pytest.approx(life_rate(phase_start, epochs(phase_start, end)))] * 2


def test_trials_that_started_before_their_phase_leave_its_durations_and_life_rates_out(
    sessions: Sessions, tmp_path: Path
) -> None:
    # Scripts that report nothing: N=3 over the median duration of the trials that ended.
    sweep_id = a_sweep(sessions, tmp_path)
    phase_start = utcnow()
    start = phase_start + TIMING.settle
    with sessions.write.begin() as session:
        # Two started beside the last N's wave, 30 s and 28 s before the phase; one its own.
        for age in (30, 28, 0):
            trial = add_trial(session, sweep_id, phase_start - timedelta(seconds=age), [])
            trial.ended_at = start + timedelta(seconds=3)
            trial.status = TrialStatus.succeeded
        session.flush()
        window, unit = closing_window(
            session, sweep_id, phase_start, unit=TRIALS_PER_S, measured=True
        )
        assert window is not None
        point, _ = measure(
            session=session, window=window, unit=unit, split=3, measured=True, peak_mb=None
        )
    # The phase's own trial alone: 8 s, not the median of 38, 36 and 8.
    assert point is not None
    assert point.throughput == pytest.approx(3 / 8)


def test_trials_that_ended_before_reporting_twice_in_the_window_give_their_steady_readings(
    sessions: Sessions, tmp_path: Path
) -> None:
    sweep_id = a_sweep(sessions, tmp_path)
    phase_start, start, _ = phase_times()
    with sessions.write.begin() as session:
        # Its own: an epoch every 2 s after 4 s of start-up, ended 3 s into the window, before a
        # second report half a window after its first there.
        trial = add_trial(
            session, sweep_id, phase_start, epochs(phase_start, start + timedelta(seconds=3))
        )
        trial.ended_at = start + timedelta(seconds=3)
        trial.status = TrialStatus.succeeded
        session.flush()
        window, _ = closing_window(
            session, sweep_id, phase_start, unit=SAMPLES_PER_S, measured=False
        )
    assert window is not None and window.rates == []
    assert [(r.rate, r.startup_s) for r in window.steady] == [
        pytest.approx((EPOCH_SAMPLES / EPOCH_S, STARTUP_S))
    ]


def test_a_trial_launched_in_the_tick_its_phase_began_is_its_own_with_no_settle_time(
    sessions: Sessions, tmp_path: Path
) -> None:
    timing = Timing(settle=timedelta(0), window=timedelta(seconds=10), poll=timedelta(seconds=1))
    sweep_id = a_sweep(sessions, tmp_path)
    phase_start = utcnow()
    end = phase_start + timing.window
    with sessions.write.begin() as session:
        before = phase_start - timedelta(seconds=30)
        old = add_trial(session, sweep_id, before, epochs(before, end))
        # The filler launched it, then the search stamped the phase, 50 ms later.
        tick = phase_start - timedelta(milliseconds=50)
        own = add_trial(session, sweep_id, tick, epochs(tick, end, 0.0))
        rates = trial_rates(
            session=session,
            trials=[old, own],
            phase_start=phase_start,
            start=phase_start,
            end=end,
            unit=SAMPLES_PER_S,
            timing=timing,
        )
    assert rates == {own.id: pytest.approx(life_rate(tick, epochs(tick, end, 0.0)))}


@pytest.mark.parametrize(("split", "need"), [(1, 1), (2, 2), (8, 8), (13, 12), (15, 14), (34, 31)])
def test_a_span_counts_as_ns_with_a_tenth_of_n_short_at_most(split: int, need: int) -> None:
    # A tenth of N may be starting up, or between a trial's end and its refill.
    assert Computing(split=split, spans=[], least=0.0).need == need


def test_a_point_takes_the_rates_read_beside_n_and_every_trials_start_up(
    sessions: Sessions,
) -> None:
    steady = [
        Steady(rate=10.0, startup_s=9.0),
        Steady(rate=30.0, startup_s=2.0, beside_n=False),
        Steady(rate=40.0, startup_s=4.0, beside_n=False),
    ]

    def point_of(readings: list[Steady]) -> tuple[float | None, float | None]:
        with sessions.read() as session:
            point, _ = measure(
                session=session,
                window=Window(rates=[12.0, 20.0, 30.0], ended=[], steady=readings),
                unit=SAMPLES_PER_S,
                split=3,
                measured=True,
                peak_mb=None,
            )
        assert point is not None
        return point.rate, point.startup_s

    assert point_of(steady) == (10.0, 4.0)
    # None beside N: the rates of all.
    assert point_of(steady[1:]) == (35.0, 3.0)
