from __future__ import annotations

import itertools
import math
from dataclasses import replace
from datetime import datetime, timedelta
from fractions import Fraction
from pathlib import Path

import pytest
from builders import sweep_plan
from sqlalchemy.orm import Session

from gpumux.devices.kinds.base import FirstSplit
from gpumux.splits.curve import Decision, workload_fingerprint
from gpumux.splits.mix import Mix
from gpumux.splits.online import SplitSearch
from gpumux.splits.out_of_memory import is_out_of_memory
from gpumux.splits.priors import resume_search
from gpumux.splits.window import Timing
from gpumux.status import TrialStatus
from gpumux.storage import owners as owner_store
from gpumux.storage import profiles as profile_store
from gpumux.storage import sweeps as sweep_store
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Trial, TrialReport, utcnow
from gpumux.throughput import CurvePoint

TIMING = Timing(settle=timedelta(seconds=5), window=timedelta(seconds=10))
COMMAND = ["python", "train.py"]
TOKENS = ["batch_size=32", "lr=1e-3..1e-1"]
NUMBERS = itertools.count(1)


@pytest.fixture
def trial_id(sessions: Sessions, tmp_path: Path) -> int:
    with sessions.write.begin() as session:
        owner = owner_store.get_or_create_owner(session=session, name="alice")
        sweep = sweep_store.create_sweep(
            session=session,
            plan=sweep_plan(tmp_path, *TOKENS, command=COMMAND, seed=1, trial_params=[{}]),
            owner=owner,
        )
        trial = trial_store.list_trials(session=session, sweep_id=sweep.id)[0][0]
        trial.device = "cpu"
        return trial.id


def search_of(sessions: Sessions, guess: FirstSplit | None = None) -> SplitSearch:
    """The search of sweep 1's workload on the CPU device, as the daemon makes it."""
    with sessions.read() as session:
        sweep = sweep_store.get_sweep(session=session, sweep_id=1)
        assert sweep is not None
        return resume_search(
            session=session,
            device_key="cpu",
            device_name="Test CPU",
            workdir=sweep.workdir,
            command=sweep.command,
            param_tokens=sweep.param_tokens,
            ceiling=8,
            timing=TIMING,
            guess=guess,
        )


def ended_trial(started: datetime, ended: datetime, split: int = 1) -> Trial:
    """A trial of sweep 1 that ran on the CPU device under `split` from `started` to `ended`."""
    return Trial(
        sweep_id=1,
        number=next(NUMBERS),
        params={},
        status=TrialStatus.succeeded,
        device="cpu",
        split=split,
        started_at=started,
        ended_at=ended,
    )


def running_trial(started: datetime, split: int) -> Trial:
    """A trial of sweep 1 running on the CPU device under `split` since `started`."""
    return Trial(
        sweep_id=1,
        number=next(NUMBERS),
        params={},
        status=TrialStatus.running,
        device="cpu",
        split=split,
        started_at=started,
    )


def report(trial: Trial, at: datetime, samples: float) -> TrialReport:
    return TrialReport(
        trial_id=trial.id, attempt=1, kind="batch", at=at, samples=samples, seconds=1.0, metrics={}
    )


def run_phase(
    sessions: Sessions,
    search: SplitSearch,
    trial_id: int,
    start: datetime,
    rate: float,
    queued: int = 9,
    *,
    counted: bool = True,
    shared: Fraction = Fraction(0),
) -> datetime:
    """N trials run for settle + window, reporting `rate` samples/s in all from their start
    (no start-up), `queued` waiting (all of them seen: `counted`), and another workload's
    trials holding `shared` of the device beside them; returns the end."""
    split = search.split
    mix = Mix.alone(running=split, queued=queued, split=split)
    mix = replace(mix, shares=mix.shares + shared, counted=counted)
    with sessions.write.begin() as session:
        search.observe(
            session=session, now=start, running=split, queued=queued, sweep_id=1, mix=mix
        )
        trials = [running_trial(start, split) for _ in range(split)]
        session.add_all(trials)
        session.flush()
        for second in range(1, 17):
            for trial in trials:
                at = start + timedelta(seconds=second)
                session.add(report(trial, at, rate / split))
        session.flush()
        end = start + TIMING.settle + TIMING.window
        search.observe(session=session, now=end, running=split, queued=queued, sweep_id=1, mix=mix)
        search.save(session=session)  # as the scheduler does for a search that changed
        for trial in trials:
            trial.status, trial.ended_at = TrialStatus.succeeded, end
    return end + timedelta(seconds=1)


def test_the_search_climbs_measures_each_window_settles_at_the_knee_and_stores_it(
    sessions: Sessions, trial_id: int
) -> None:
    throughput = {1: 100.0, 2: 190.0, 3: 195.0, 5: 196.0}
    search = search_of(sessions)
    now = utcnow()
    tried = []
    while not search.decision.settled:
        tried.append(search.split)
        now = run_phase(sessions, search, trial_id, now, throughput[search.split])
    assert tried == [1, 2, 3, 5]
    assert search.split == 2 and "knee" in search.decision.reason
    # Reports in the window (the settle time excluded) over the window's length.
    assert [round(p.throughput) for p in sorted(search.curve, key=lambda p: p.split)] == [
        100,
        190,
        195,
        196,
    ]
    with sessions.read() as session:
        (profile,), _ = profile_store.list_profiles(session=session)
        assert profile.settled and profile.best_split == 2 and profile.unit == "samples/s"
        assert profile.param_tokens == ["batch_size=32"] and profile.sweep_id == 1
    again = search_of(sessions)
    assert again.decision.settled and again.split == 2
    assert f"profile {profile.id} of this workload" in again.decision.reason


def test_a_phase_starts_over_when_fewer_than_n_run_and_the_tail_measures_nothing(
    sessions: Sessions, trial_id: int
) -> None:
    search = search_of(sessions)
    now = utcnow()
    with sessions.write.begin() as session:
        search.observe(session=session, now=now, running=1, queued=3, sweep_id=1)
        assert search.phase_start == now
        short = now + timedelta(seconds=3)
        search.observe(session=session, now=short, running=0, queued=0, sweep_id=1)
        # A moment short of N (a trial ended, its refill not placed yet) does not end the
        # phase; longer than the next probe and a tick, it does.
        assert search.phase_start == now
        later = short + TIMING.dip + timedelta(seconds=1)
        search.observe(session=session, now=later, running=0, queued=0, sweep_id=1)
        assert search.phase_start is None and search.filling_since is None
        late = now + timedelta(seconds=60)
        search.observe(session=session, now=late, running=0, queued=0, sweep_id=1)
    assert search.curve == [] and search.split == 1


def test_a_phase_short_of_n_for_a_moment_is_measured_as_one(
    sessions: Sessions, trial_id: int
) -> None:
    search = search_of(sessions)
    now = run_phase(sessions, search, trial_id, utcnow(), 100.0)
    assert search.split == 2
    with sessions.write.begin() as session:
        search.observe(session=session, now=now, running=2, queued=9, sweep_id=1)
        trials = [running_trial(now, 2) for _ in range(2)]
        session.add_all(trials)
        session.flush()
        session.add_all(
            report(trial, now + timedelta(seconds=s), 95.0)
            for trial in trials
            for s in range(1, 17)
        )
        session.flush()
        # One of them ended a second in; its refill came at the next tick, within the margin.
        blink = now + timedelta(seconds=1)
        search.observe(session=session, now=blink, running=1, queued=9, sweep_id=1)
        refilled = blink + TIMING.dip
        search.observe(session=session, now=refilled, running=2, queued=8, sweep_id=1)
        assert search.phase_start == now
        end = now + TIMING.settle + TIMING.window
        search.observe(session=session, now=end, running=2, queued=8, sweep_id=1)

    assert [p.split for p in search.curve] == [1, 2]
    assert search.curve[-1].throughput == pytest.approx(2 * 95.0)


def test_a_phase_short_of_n_after_n_changed_starts_over(sessions: Sessions, trial_id: int) -> None:
    search = search_of(sessions, FirstSplit(split=6, why="memory's guess", probe=3))
    now = utcnow()
    with sessions.write.begin() as session:
        search.observe(session=session, now=now, running=3, queued=9, sweep_id=1)
        assert search.phase_start == now
        # Memory fits 2 of the wave's trials: N drops while its 3 trials still run.
        search.lower_ceiling(2, why="only 2 trial(s) fit at once", keep=False)
        assert search.split == 2
        ended = now + timedelta(seconds=1)
        search.observe(
            session=session,
            now=ended,
            running=0,
            queued=9,
            sweep_id=1,
            mix=Mix(shares=Fraction(3, 3), stale=3),
        )
        full = ended + timedelta(seconds=1)
        search.observe(session=session, now=full, running=2, queued=7, sweep_id=1)

    # Not a moment short of N=3: N=2's phase begins with its own trials.
    assert search.phase_start == full


def test_no_room_for_n_while_work_waits_lowers_the_ceiling(
    sessions: Sessions, trial_id: int
) -> None:
    search = search_of(sessions)
    now = utcnow()
    run_phase(sessions, search, trial_id, now, 100.0)
    assert search.split == 2
    with sessions.write.begin() as session:
        start = now + timedelta(minutes=5)
        search.observe(session=session, now=start, running=1, queued=4, sweep_id=1)
        stuck = start + TIMING.settle + TIMING.window + timedelta(seconds=1)
        search.observe(session=session, now=stuck, running=1, queued=4, sweep_id=1)
    assert search.ceiling == 1 and search.decision.settled and search.split == 1
    # What held the trial back may pass (another workload, a user's limit): not kept.
    assert search.lowered is None


def test_out_of_memory_at_n_settles_below_it(sessions: Sessions, trial_id: int) -> None:
    search = search_of(sessions)
    now = run_phase(sessions, search, trial_id, utcnow(), 100.0)
    now = run_phase(sessions, search, trial_id, now, 190.0)
    assert search.split == 3
    with sessions.write.begin() as session:
        search.out_of_memory(session=session, split=3)
    assert search.decision.settled and search.split == 2
    assert "out of memory at N=3" in search.decision.reason


@pytest.mark.parametrize(
    ("tail", "oom"),
    [
        (
            "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating",
            True,
        ),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", True),
        ("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory", True),
        ("ValueError: could not convert string to float: 'x'", False),
    ],
)
def test_out_of_memory_is_recognised_from_the_frameworks_messages(tail: str, oom: bool) -> None:
    assert is_out_of_memory(tail) is oom


def steady_trials(
    session: Session, start: datetime, split: int, rate: float, until: float
) -> list[Trial]:
    """N trials started at `start` that each start up for 5 s, then report `rate` samples
    every second up to `until` seconds in."""
    trials = [running_trial(start, split) for _ in range(split)]
    session.add_all(trials)
    session.flush()
    for second in range(6, int(until) + 1):
        session.add_all(report(t, start + timedelta(seconds=second), rate) for t in trials)
    session.flush()
    return trials


def test_every_point_is_read_at_what_one_trial_of_the_sweep_does(
    sessions: Sessions, trial_id: int
) -> None:
    search = search_of(sessions)
    start = utcnow()
    end = start + TIMING.settle + TIMING.window
    with sessions.write.begin() as session:
        search.observe(session=session, now=start, running=1, queued=5, sweep_id=1)
        (first,) = steady_trials(session, start, 1, 10.0, until=15)
        search.observe(session=session, now=end, running=1, queued=5, sweep_id=1)
        # Read young: the 100 samples its trial did so far, after 5 s of start-up.
        (point,) = search.curve
        assert (point.rate, point.startup_s) == pytest.approx((10.0, 5.0))
        assert point.throughput == pytest.approx(100 / (5 + 100 / 10))
        assert search.split == 2
        # It runs on to do 300 in all.
        for second in range(16, 36):
            session.add(report(first, start + timedelta(seconds=second), 10.0))
        first.status, first.ended_at = TrialStatus.succeeded, start + timedelta(seconds=35)
        later = start + timedelta(seconds=36)
        search.observe(session=session, now=later, running=2, queued=4, sweep_id=1)
        pair = steady_trials(session, later, 2, 8.0, until=15)
        search.observe(
            session=session,
            now=later + TIMING.settle + TIMING.window,
            running=2,
            queued=4,
            sweep_id=1,
        )
        # Both read at 300 samples a trial: N=1 5 s starting and 30 s computing; N=2 5 s and
        # 37.5 s.
        assert [(p.split, p.throughput) for p in search.curve] == [
            (1, pytest.approx(300 / (5 + 300 / 10))),
            (2, pytest.approx(2 * 300 / (5 + 300 / 8))),
        ]
        # The sweep ends with the pair's 440 each: the next sweep goes on from the points read
        # at the median of what its trials did, 440.
        for trial in pair:
            session.add_all(
                report(trial, later + timedelta(seconds=second), 8.0) for second in range(16, 61)
            )
            trial.status, trial.ended_at = TrialStatus.succeeded, later + timedelta(seconds=60)
        session.flush()
        assert search.sweep_ended(session=session)
    assert [(p.split, p.throughput) for p in search.curve] == [
        (1, pytest.approx(440 / (5 + 440 / 10))),
        (2, pytest.approx(2 * 440 / (5 + 440 / 8))),
    ]


def test_a_stored_curve_without_steady_readings_is_measured_again_from_its_lowest_n(
    sessions: Sessions, trial_id: int
) -> None:
    # N=3 and N=5 as a profile from before points had steady readings stored them, read young:
    # beside points read at a trial's work they would not compare.
    fresh = search_of(sessions)
    with sessions.write.begin() as session:
        fresh.curve = [CurvePoint(split=3, throughput=300.0), CurvePoint(split=5, throughput=310.0)]
        fresh.save(session=session)
    search = search_of(sessions)
    assert search.curve == [] and (search.start, search.split) == (3, 3)
    # One with its steady readings goes on from its curve.
    with sessions.write.begin() as session:
        fresh.curve = [replace(p, rate=10.0, startup_s=1.0) for p in fresh.curve]
        fresh.save(session=session)
    search = search_of(sessions)
    assert [p.split for p in search.curve] == [3, 5] and search.split == 8


def test_a_long_trial_is_measured_once_it_reported_twice_after_the_settle_time(
    sessions: Sessions, trial_id: int
) -> None:
    search = search_of(sessions)
    start = utcnow()
    with sessions.write.begin() as session:
        search.observe(session=session, now=start, running=1, queued=5, sweep_id=1)
        trial = running_trial(start - timedelta(seconds=1), 1)
        session.add(trial)
        session.flush()
        session.add(report(trial, start + timedelta(seconds=3), 100.0))  # in its settle time
        session.add(report(trial, start + TIMING.settle + timedelta(seconds=2), 100.0))
        session.flush()
        later = start + TIMING.settle + TIMING.window + timedelta(seconds=1)
        search.observe(session=session, now=later, running=1, queued=5, sweep_id=1)
        assert search.curve == [], "one report after the settle time gives no rate"
        session.add(report(trial, start + timedelta(seconds=47), 600.0))
        session.flush()
        end = start + timedelta(seconds=50)
        search.observe(session=session, now=end, running=1, queued=5, sweep_id=1)
    (point,) = search.curve
    # Read at what it does (the 800 it reported): at its steady rate from its first report to
    # its last, 700 in 44 s, with no start-up to count (its first 100 came faster than that).
    assert (point.rate, point.startup_s) == pytest.approx((700 / 44, 0.0))
    assert point.throughput == pytest.approx(700 / 44)
    assert search.split == 2


def steps_report(trial: Trial, at: datetime, steps: float) -> TrialReport:
    """What the runtime's optimizer-step counter sends: steps, no samples."""
    return TrialReport(
        trial_id=trial.id, attempt=1, kind="steps", at=at, steps=steps, seconds=1.0, metrics={}
    )


@pytest.mark.parametrize("samples_at", [(), (6, 9, 12), (12,)])
def test_optimizer_steps_are_the_unit_of_a_workload_that_reports_no_samples(
    sessions: Sessions, trial_id: int, samples_at: tuple[int, ...]
) -> None:
    search = search_of(sessions)
    start = utcnow()
    with sessions.write.begin() as session:
        search.observe(session=session, now=start, running=1, queued=5, sweep_id=1)
        trial = running_trial(start - timedelta(seconds=1), 1)
        session.add(trial)
        session.flush()
        for second in (6, 9, 12):
            session.add(steps_report(trial, start + timedelta(seconds=second), 40.0))
        for second in samples_at:
            session.add(report(trial, start + timedelta(seconds=second), 1000.0))
        # A trial of the sweep that ran to its end before: 240 steps, no samples.
        done = ended_trial(start - timedelta(seconds=60), start - timedelta(seconds=30))
        done.device = None
        session.add(done)
        session.flush()
        session.add(steps_report(done, start - timedelta(seconds=31), 240.0))
        session.flush()
        end = start + TIMING.settle + TIMING.window
        search.observe(session=session, now=end, running=1, queued=5, sweep_id=1)
    if not samples_at:
        assert search.unit == "steps/s"
        # Its steady rate 80 steps in 6 s, after 13 - 120 / (80 / 6) = 4 s of start-up; read at
        # the steps one trial does, the ended one's 240.
        assert [p.throughput for p in search.curve] == [pytest.approx(240 / (4 + 240 * 6 / 80))]
        # Measured on the running trial's rate: its point counts that trial, and is stored.
        assert [p.trials for p in search.curve] == [1]
        with sessions.write.begin() as session:
            search.save(session=session)
    elif len(samples_at) > 1:
        assert search.unit == "samples/s"
        assert [p.throughput for p in search.curve] == [pytest.approx(3000.0 / 13)]
    else:
        # Samples win, even when too rare for a rate yet: the window waits for them.
        assert search.unit == "samples/s" and search.curve == []


def test_a_workload_whose_framework_sees_no_gpu_is_not_measured_and_says_why(
    sessions: Sessions, trial_id: int
) -> None:
    search = search_of(sessions)
    start = utcnow()
    with sessions.write.begin() as session:
        search.observe(session=session, now=start, running=1, queued=5, sweep_id=1)
        trial = running_trial(start - timedelta(seconds=1), 1)
        trial.no_gpu = "tensorflow"
        session.add(trial)
        session.flush()
        for second in (6, 9, 12):
            session.add(report(trial, start + timedelta(seconds=second), 1000.0))
        session.flush()
        end = start + TIMING.settle + TIMING.window
        search.observe(session=session, now=end, running=1, queued=5, sweep_id=1)
        # Halted: later windows measure nothing either.
        search.observe(
            session=session, now=end + TIMING.window * 2, running=1, queued=5, sweep_id=1
        )
    assert search.curve == [] and not search.decision.settled and search.split == 1
    assert search.decision.reason == (
        f"unsettled: tensorflow sees no GPU in trial {trial.id} (it trains on the CPU); its "
        "throughput is not this GPU's, so N stays 1"
    )
    with sessions.read() as session:
        assert search.sweep_ended(session=session)
    # The profile the sweep leaves says why it has no point.
    assert "(tensorflow sees no GPU in trial" in search.decision.reason


def test_a_script_that_reports_nothing_is_measured_as_n_over_the_trial_duration(
    sessions: Sessions, trial_id: int
) -> None:
    search = search_of(sessions)
    start = utcnow()
    with sessions.write.begin() as session:
        search.observe(session=session, now=start, running=1, queued=5, sweep_id=1)
        session.add(ended_trial(start, start + TIMING.settle + timedelta(seconds=3)))
        session.flush()
        end = start + TIMING.settle + TIMING.window
        search.observe(session=session, now=end, running=1, queued=5, sweep_id=1)
    (point,) = search.curve
    assert search.unit == "trials/s"
    assert point.throughput == pytest.approx(1 / 8) and point.seconds_per_trial == 8


def test_the_most_memory_one_trial_held_while_n_ran_is_stored_with_its_point(
    sessions: Sessions, trial_id: int
) -> None:
    search = search_of(sessions)
    start = utcnow()

    def tick(at: datetime, running: int, held: list[int]) -> None:
        search.observe(session=session, now=at, running=running, queued=5, sweep_id=1, held=held)

    with sessions.write.begin() as session:
        tick(start, 1, [5000])
        # Fewer than N, for longer than a moment: that phase is over, and what it saw does not
        # measure N.
        short = start + timedelta(seconds=1)
        tick(short, 0, [])
        tick(short + TIMING.dip + timedelta(seconds=1), 0, [])
        begin = short + TIMING.dip + timedelta(seconds=2)
        tick(begin, 1, [700])
        tick(begin + timedelta(seconds=3), 1, [900])
        tick(begin + timedelta(seconds=4), 1, [])
        session.add(ended_trial(begin, begin + TIMING.settle + timedelta(seconds=3)))
        session.flush()
        tick(begin + TIMING.settle + TIMING.window, 1, [800])
        search.save(session=session)
    (point,) = search.curve
    assert point.split == 1 and point.memory_per_trial_mb == 900
    with sessions.read() as session:
        (profile,), _ = profile_store.list_profiles(session=session)
    assert profile.curve[0]["memory_per_trial_mb"] == 900.0
    again = search_of(sessions)
    assert again.curve == [point]


def test_a_phase_measured_without_memory_stores_none(sessions: Sessions, trial_id: int) -> None:
    search = search_of(sessions)
    run_phase(sessions, search, trial_id, utcnow(), 100.0)
    (point,) = search.curve
    assert point.memory_per_trial_mb is None


def test_reports_of_absurd_samples_never_put_an_infinite_throughput_in_the_curve(
    sessions: Sessions, trial_id: int
) -> None:
    # Stored as the database may hold them (from before ReportIn was bounded): their sum
    # over a window overflows to infinity.
    search = search_of(sessions)
    now = run_phase(sessions, search, trial_id, utcnow(), 1e308)
    assert search.curve == [] and not search.decision.settled
    with sessions.write.begin() as session:
        # Its trials ended with nothing in range measured: the phase starts over.
        search.observe(session=session, now=now, running=1, queued=9, sweep_id=1)
    assert search.phase_start is None and search.curve == []
    # The next window, of sane reports, is measured as if the absurd one never was.
    run_phase(sessions, search, trial_id, now + timedelta(seconds=100), 100.0)
    assert [point.split for point in search.curve] == [1]
    assert all(math.isfinite(point.throughput) for point in search.curve)
    with sessions.read() as session:
        (profile,), _ = profile_store.list_profiles(session=session)
        assert [CurvePoint.from_json(point).split for point in profile.curve] == [1]
    assert [point.split for point in search_of(sessions).curve] == [1]


def save_profile(
    sessions: Sessions,
    tokens: list[str],
    *,
    best: int | None,
    settled: bool,
    oom_at: int | None = None,
    ceiling: int | None = None,
) -> int:
    """A profile of train.py with these cost parameters on the test CPU, as a search stores it."""
    with sessions.write.begin() as session:
        profile = profile_store.save_profile(
            session=session,
            device_name="Test CPU",
            fingerprint=workload_fingerprint(COMMAND, tokens),
            command=COMMAND,
            param_tokens=tokens,
            unit="samples/s",
            curve=[
                {"split": 3, "throughput": 300.0, "rate": 100.0, "startup_s": 1.0},
                {"split": 5, "throughput": 310.0, "rate": 62.0, "startup_s": 1.0},
            ],
            best_split=best,
            settled=settled,
            reason="knee",
            sweep_id=None,
            oom_at=oom_at,
            ceiling=ceiling,
        )
        return profile.id


def guessed(sessions: Sessions, guess: FirstSplit | None) -> SplitSearch:
    with sessions.read() as session:
        return resume_search(
            session=session,
            device_key="cpu",
            device_name="Test CPU",
            command=COMMAND,
            param_tokens=TOKENS,
            ceiling=8,
            timing=TIMING,
            guess=guess,
        )


def test_a_new_workload_starts_at_the_device_kinds_guess(sessions: Sessions) -> None:
    search = guessed(sessions, FirstSplit(split=2, why="the device's 2 cores"))

    assert search.split == 2 and not search.decision.settled
    assert search.decision.reason == "measuring N=2; started at N=2: the device's 2 cores"
    assert guessed(sessions, FirstSplit(split=20, why="many cores")).split == 8, "the ceiling"


def test_a_first_wave_whose_trials_show_no_memory_is_a_point_and_the_start_follows(
    sessions: Sessions, trial_id: int
) -> None:
    search = search_of(sessions, FirstSplit(split=6, why="memory's guess", probe=3))
    assert search.split == 3 and search.probe == 3
    assert search.decision.reason == (
        "learning what a trial holds at N=3; started at N=6: memory's guess"
    )

    # The first wave computes, yet the device never showed what a trial holds: its window is
    # the first point all the same, and the guess's N follows.
    run_phase(sessions, search, trial_id, utcnow(), 300.0)

    assert search.probe is None and [p.split for p in search.curve] == [3]
    assert search.split == 6 and not search.decision.settled, search.decision.reason


def test_a_first_wave_that_showed_what_a_trial_holds_is_measured_before_the_start(
    sessions: Sessions, trial_id: int
) -> None:
    search = search_of(sessions, FirstSplit(split=6, why="memory's guess", probe=3))
    start = utcnow()
    with sessions.write.begin() as session:
        search.observe(session=session, now=start, running=3, queued=9, sweep_id=1)
    # Its trials showed what one holds, mid-phase: memory fits 5 of them.
    search.lower_ceiling(5, why="memory fits 5")
    search.learned(why="a trial at N=3 holds 9000 MiB")

    # The wave goes on being measured: the phase it began is not thrown away.
    assert search.probe is None and search.phase_start == start
    assert search.split == 3, search.decision.reason
    assert search.decision.reason == "measuring N=3, the first wave; started at N=6: memory's guess"
    run_phase(sessions, search, trial_id, start, 300.0)

    # Its point is the first; the guess's N follows within what memory fits.
    assert [p.split for p in search.curve] == [3]
    assert search.split == 5 and not search.decision.settled, search.decision.reason


def test_a_sweep_too_short_for_the_start_after_its_first_wave_leaves_the_search_open(
    sessions: Sessions, trial_id: int
) -> None:
    search = search_of(sessions, FirstSplit(split=6, why="memory's guess", probe=3))
    now = run_phase(sessions, search, trial_id, utcnow(), 300.0)
    assert search.split == 6

    with sessions.write.begin() as session:
        search.observe(session=session, now=now, running=0, queued=5, sweep_id=1)

    # The first wave's point is half a cautious guess, nothing of the climb: settling there
    # would hold every later sweep of the workload at it.
    assert not search.decision.settled and search.split == 6, search.decision.reason


def test_a_first_wave_once_measured_is_never_measured_again(
    sessions: Sessions, trial_id: int
) -> None:
    search = search_of(sessions, FirstSplit(split=6, why="memory's guess", probe=3))
    now = run_phase(sessions, search, trial_id, utcnow(), 300.0)
    # The start's point cannot be beside the wave's (6 trials at 4x 3's): both are dropped.
    run_phase(sessions, search, trial_id, now, 1200.0)

    assert search.curve == [] and search.rejected == 1
    assert search.split == 6 and search.first_wave is None, search.decision.reason


def test_a_first_wave_under_a_lowered_ceiling_says_the_n_it_measures(
    sessions: Sessions, trial_id: int
) -> None:
    search = search_of(sessions, FirstSplit(split=6, why="memory's guess", probe=3))
    search.learned(why="a trial at N=3 holds 9000 MiB")

    search.lower_ceiling(2, why="only 2 trial(s) fit at once", keep=False)

    assert search.decision == Decision(
        split=2,
        settled=False,
        reason="measuring N=2, the first wave; started at N=6: memory's guess",
    )


def test_a_first_wave_that_runs_out_of_memory_backs_off_below_it(
    sessions: Sessions, trial_id: int
) -> None:
    search = guessed(sessions, FirstSplit(split=6, why="memory's guess", probe=3))
    with sessions.write.begin() as session:
        search.out_of_memory(session=session, split=3)
    assert search.probe is None and search.split < 3, search.decision.reason


def test_a_similar_workloads_settled_profile_is_the_start(sessions: Sessions) -> None:
    other = save_profile(sessions, ["batch_size=256"], best=5, settled=True)
    save_profile(sessions, ["batch_size=512"], best=None, settled=False)

    search = guessed(sessions, FirstSplit(split=2, why="the device's 2 cores"))

    assert search.split == 5 and not search.decision.settled
    assert search.decision.reason == (
        f"measuring N=5; started at N=5: profile {other} of a similar workload (batch_size=256)"
    )


def test_a_profile_of_another_command_is_no_prior(sessions: Sessions) -> None:
    with sessions.write.begin() as session:
        profile_store.save_profile(
            session=session,
            device_name="Test CPU",
            fingerprint="other",
            command=["python", "other.py"],
            param_tokens=[],
            unit="samples/s",
            curve=[],
            best_split=5,
            settled=True,
            reason="knee",
            sweep_id=None,
        )

    assert guessed(sessions, FirstSplit(split=2, why="the device's 2 cores")).split == 2


def test_an_unsettled_profile_of_the_workload_goes_on_from_its_curve(sessions: Sessions) -> None:
    own = save_profile(sessions, TOKENS, best=None, settled=False)

    search = guessed(sessions, FirstSplit(split=2, why="the device's 2 cores"))

    # From N=3, the lowest it measured: N=5 missed, so one more step up decides the knee.
    assert search.start == 3 and search.split == 8
    assert (
        search.decision.reason == f"measuring N=8; started at N=3: profile {own} of this workload"
    )


def test_a_stored_oom_and_ceiling_bound_the_next_search(sessions: Sessions, trial_id: int) -> None:
    own = save_profile(sessions, TOKENS, best=None, settled=False, oom_at=5, ceiling=7)

    search = guessed(sessions, None)

    assert (search.oom_at, search.ceiling, search.lowered) == (5, 7, 7)
    # N=5 ran out of memory: the ascent from N=3 tries the N just below it, not N=5.
    assert search.decision == Decision(
        split=4,
        settled=False,
        reason=f"measuring N=4; started at N=3: profile {own} of this workload",
    )
    with sessions.write.begin() as session:
        search.save(session=session)
    with sessions.read() as session:
        (profile,), _ = profile_store.list_profiles(session=session)
    assert (profile.oom_at, profile.ceiling) == (5, 7)


def test_a_settled_profile_above_a_stored_oom_is_held_below_it(sessions: Sessions) -> None:
    save_profile(sessions, TOKENS, best=5, settled=True, oom_at=4)

    search = guessed(sessions, FirstSplit(split=2, why="the device's 2 cores"))

    assert search.decision.settled and search.split == 3


def test_out_of_memory_and_a_lowered_ceiling_are_stored_for_the_next_sweep(
    sessions: Sessions, trial_id: int
) -> None:
    search = guessed(sessions, FirstSplit(split=5, why="the device's 5 cores"))
    assert search.split == 5
    search.lower_ceiling(6, why="only 6 trial(s) fit at once")
    with sessions.write.begin() as session:
        search.out_of_memory(session=session, split=5)
    # The start itself ran out: half of it, twice the slice.
    assert search.split == 2, search.decision.reason

    again = guessed(sessions, FirstSplit(split=5, why="the device's 5 cores"))

    assert (again.oom_at, again.ceiling) == (5, 6)
    assert again.split == 2, again.decision.reason


def test_a_point_that_cannot_be_is_measured_again_never_stored(
    sessions: Sessions, trial_id: int
) -> None:
    # As on a loaded 2-core machine: N=1 slowed by other work, then N=2 at 14x it.
    search = search_of(sessions)
    search.cores = 2
    now = run_phase(sessions, search, trial_id, utcnow(), 3941.0)
    assert search.split == 2
    now = run_phase(sessions, search, trial_id, now, 54867.0)

    assert search.curve == [], "neither point of the pair is kept"
    assert search.split == 1 and search.rejected == 1
    with sessions.read() as session:
        (profile,), _ = profile_store.list_profiles(session=session)
        assert profile.curve == [] and not profile.settled
    # Measured again, the two agree: the search goes on from them.
    now = run_phase(sessions, search, trial_id, now, 4000.0)
    now = run_phase(sessions, search, trial_id, now, 7600.0)
    assert [p.split for p in search.curve] == [1, 2] and search.split == 3


def test_a_search_whose_points_keep_conflicting_stops_for_the_sweep_and_says_why(
    sessions: Sessions, trial_id: int
) -> None:
    search = search_of(sessions)
    search.cores = 2
    now = utcnow()
    for _ in range(3):
        now = run_phase(sessions, search, trial_id, now, 1000.0)
        now = run_phase(sessions, search, trial_id, now, 10000.0)

    assert search.halted is not None and not search.decision.settled
    assert search.decision.reason.startswith("unsettled: 3 points could not be")
    split = search.split
    run_phase(sessions, search, trial_id, now, 50.0)
    assert search.split == split and search.curve == [], "a stopped search measures nothing"
    with sessions.read() as session:
        (profile,), _ = profile_store.list_profiles(session=session)
        assert not profile.settled and profile.reason == search.decision.reason


def test_each_point_says_how_sure_it_is(sessions: Sessions, trial_id: int) -> None:
    search = search_of(sessions)
    run_phase(sessions, search, trial_id, utcnow(), 100.0)

    (point,) = search.curve
    assert point.trials == 1 and point.spread == 0.0
    with sessions.read() as session:
        (profile,), _ = profile_store.list_profiles(session=session)
        assert profile.curve[0]["trials"] == 1 and profile.curve[0]["spread"] == 0.0


def test_a_sweep_that_ends_before_its_search_settled_leaves_a_profile_that_says_so(
    sessions: Sessions, trial_id: int
) -> None:
    search = search_of(sessions)
    run_phase(sessions, search, trial_id, utcnow(), 100.0)
    assert not search.decision.settled and search.split == 2

    with sessions.read() as session:
        assert search.sweep_ended(session=session)
        assert not search.sweep_ended(session=session), "said once"
    assert search.decision.reason == (
        "unsettled: the sweep ended after 1 point(s), the next sweep goes on from them; "
        "measuring N=2"
    )
    with sessions.write.begin() as session:
        search.save(session=session)
    again = search_of(sessions)
    assert again.split == 2 and [p.split for p in again.curve] == [1]


def test_points_measured_before_their_trials_ended_take_their_times_when_the_sweep_ends(
    sessions: Sessions, trial_id: int
) -> None:
    search = search_of(sessions)
    now = run_phase(sessions, search, trial_id, utcnow(), 100.0)
    run_phase(sessions, search, trial_id, now, 190.0)
    # Each window closed on its trials' reports, before any of them ended.
    assert [p.seconds_per_trial for p in search.curve] == [None, None]

    with sessions.write.begin() as session:
        assert search.sweep_ended(session=session)
        search.save(session=session)

    # run_phase's trials start with their phase and end as it closes.
    took = (TIMING.settle + TIMING.window).total_seconds()
    assert [p.seconds_per_trial for p in search.curve] == [took, took]
    with sessions.read() as session:
        (profile,), _ = profile_store.list_profiles(session=session)
        assert [point["seconds_per_trial"] for point in profile.curve] == [took, took]
        assert profile.workdir is not None and profile.command == COMMAND
    # The next sweep of the workload goes on from the unsettled profile: at N=3, above both.
    again = search_of(sessions)
    assert not again.decision.settled and again.split == 3
    assert [p.seconds_per_trial for p in again.curve] == [took, took]


@pytest.mark.parametrize("raised", [True, False])
def test_a_raised_n_is_measured_beside_the_trials_left_from_the_lower_n(
    sessions: Sessions, trial_id: int, raised: bool
) -> None:
    search = search_of(sessions)
    now = run_phase(sessions, search, trial_id, utcnow(), 100.0)
    assert search.split == 2
    # The trial of N=1 runs on; its credit let one of N=2 start beside it. Raised (the
    # workload alone there, 2 trials): N=2 is measured now. Not (another workload's trial
    # beside them, or not 2 of them yet): once the trial of N=1 has ended.
    mix = Mix(shares=Fraction(3, 2), stale=1, raised=raised)
    end = now + TIMING.settle + TIMING.window
    with sessions.write.begin() as session:
        search.observe(session=session, now=now, running=1, queued=9, sweep_id=1, mix=mix)
        left = running_trial(now - TIMING.window, 1)
        trial = running_trial(now, 2)
        session.add_all([left, trial])
        session.flush()
        for s in range(1, 17):
            session.add(report(left, now + timedelta(seconds=s), 95.0))
            session.add(report(trial, now + timedelta(seconds=s), 95.0))
        session.flush()
        search.observe(session=session, now=end, running=1, queued=9, sweep_id=1, mix=mix)

    if raised:
        assert [p.split for p in search.curve] == [1, 2]
        assert search.curve[-1].throughput == pytest.approx(2 * 95.0)
        assert search.split == 3, search.decision.reason
    else:
        assert [p.split for p in search.curve] == [1] and search.phase_start is None


@pytest.mark.parametrize("cores", [None, 2])
def test_a_phase_whose_trials_never_computed_at_once_waits_on_a_gpu_not_on_the_cpu(
    sessions: Sessions, trial_id: int, cores: int | None
) -> None:
    search = search_of(sessions)
    search.cores = cores
    search.decision = Decision(split=2, settled=False, reason="measuring N=2")
    start = utcnow()
    end = start + TIMING.settle + TIMING.window
    with sessions.write.begin() as session:
        search.observe(session=session, now=start, running=2, queued=9, sweep_id=1)
        steady, brief = running_trial(start, 2), running_trial(start, 2)
        session.add_all([steady, brief])
        session.flush()
        session.add_all(report(steady, start + timedelta(seconds=s), 50.0) for s in range(1, 16))
        # The other started up for 12 s and ended after a second: 2 computed for 1 s alone.
        session.add(report(brief, start + timedelta(seconds=12), 50.0))
        brief.status, brief.ended_at = TrialStatus.succeeded, start + timedelta(seconds=13)
        session.flush()
        search.observe(session=session, now=end, running=2, queued=9, sweep_id=1)
    # A GPU's phase waits for its refills to compute beside N; the CPU's is read as it is.
    assert [p.split for p in search.curve] == ([] if cores is None else [2])


def test_a_sweep_too_short_for_the_next_n_settles_on_the_best_it_measured(
    sessions: Sessions, trial_id: int
) -> None:
    search = search_of(sessions)
    now = run_phase(sessions, search, trial_id, utcnow(), 100.0)
    now = run_phase(sessions, search, trial_id, now, 190.0)
    assert search.split == 3 and not search.decision.settled

    with sessions.write.begin() as session:
        # Enough trials left to fill N=3: the search waits for its phase.
        search.observe(session=session, now=now, running=0, queued=3, sweep_id=1)
        assert not search.decision.settled
        search.observe(session=session, now=now, running=0, queued=2, sweep_id=1)

    assert search.decision == Decision(
        split=2,
        settled=True,
        reason="2 trial(s) of the sweep left cannot fill N=3: using N=2, the best of 2 point(s) "
        "measured",
    )


def climbing_to_five(sessions: Sessions, trial_id: int) -> tuple[SplitSearch, datetime]:
    """A search that measured N=1 and N=2 scaling linearly, and the end of N=2's phase: it
    strides to N=5."""
    search = search_of(sessions)
    now = run_phase(sessions, search, trial_id, utcnow(), 100.0)
    return search, run_phase(sessions, search, trial_id, now, 200.0)


def test_a_climb_the_waiting_trials_cannot_fill_measures_them_all_and_settles_on_the_best(
    sessions: Sessions, trial_id: int
) -> None:
    search, now = climbing_to_five(sessions, trial_id)
    assert search.split == 5
    # N=5 closes with 6 trials waiting: N=8, the climb's next, they cannot fill; all 6 at once.
    now = run_phase(sessions, search, trial_id, now, 450.0, queued=6)
    assert (search.split, search.decision.settled) == (6, False)
    assert search.decision.reason == (
        "6 trial(s) of the sweep waiting cannot fill N=8: measuring N=6, all of them at once"
    )
    # Decided again (memory's fit of the new point lowers the ceiling), it still stands.
    search.lower_ceiling(7, why="memory fits 7", keep=False)
    assert (search.split, search.decision.settled) == (6, False)

    # The 6 are the sweep's last: measured, they settle the search on the best N, the largest.
    now = run_phase(sessions, search, trial_id, now, 530.0, queued=0)
    with sessions.write.begin() as session:
        search.observe(session=session, now=now, running=6, queued=0, sweep_id=1)
    assert (search.split, search.decision.settled) == (6, True)
    assert [p.split for p in sorted(search.curve, key=lambda p: p.split)] == [1, 2, 5, 6]
    assert search.decision.reason.startswith(
        "6 trial(s) of the sweep left cannot fill N=7: using N=6, the best of 4 point(s)"
    )
    # The tail decides from here: no count of trials waiting is gone by again.
    assert search.waiting is None


def test_the_next_sweep_climbs_past_the_trials_its_last_sweep_had_waiting(
    sessions: Sessions, trial_id: int
) -> None:
    search, now = climbing_to_five(sessions, trial_id)
    run_phase(sessions, search, trial_id, now, 450.0, queued=6)
    assert search.split == 6
    # The sweep ended (its last trials cancelled) before N=6 was measured: the next sweep
    # goes on from the curve, and its own trials decide where it climbs.
    with sessions.write.begin() as session:
        assert search.sweep_ended(session=session)
    assert search.split == 8, search.decision.reason


@pytest.mark.parametrize(
    ("counted", "shared", "measured"),
    [(True, Fraction(0), 6), (False, Fraction(0), 8), (True, Fraction(1, 2), 8)],
)
def test_a_climb_is_measured_at_the_waiting_trials_only_where_all_are_seen_and_it_is_alone(
    sessions: Sessions, trial_id: int, counted: bool, shared: Fraction, measured: int
) -> None:
    search, now = climbing_to_five(sessions, trial_id)
    # Not all waiting trials were counted (a line too long to read whole), or another
    # workload shares the device (its N is a share, not the trials running): the climb's N.
    run_phase(sessions, search, trial_id, now, 450.0, queued=6, counted=counted, shared=shared)
    assert [p.split for p in search.curve] == [1, 2, 5]
    assert search.split == measured, search.decision.reason


def test_a_descent_the_trials_left_cannot_fill_settles_on_the_smallest_n_that_does_as_well(
    sessions: Sessions, trial_id: int
) -> None:
    search = search_of(sessions)
    search.start, search.origin = 5, "a guess"
    # N=8 gains 4% on the start: a knee, and the search goes below the start, to 3.
    search.curve = [CurvePoint(split=5, throughput=100.0), CurvePoint(split=8, throughput=104.0)]
    search.decision = search.decide()
    assert (search.split, search.decision.settled) == (3, False)

    with sessions.write.begin() as session:
        search.observe(session=session, now=utcnow(), running=0, queued=2, sweep_id=1)

    assert (search.split, search.decision.settled) == (5, True)
    assert search.decision.reason == (
        "2 trial(s) of the sweep left cannot fill N=3: using N=5, the smallest of 2 point(s) "
        "measured within 5% of the best; started at N=5: a guess"
    )
