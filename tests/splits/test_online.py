from __future__ import annotations

import itertools
import math
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from builders import sweep_in

from gpumux.splits.online import SplitSearch, Timing, is_out_of_memory
from gpumux.status import TrialStatus
from gpumux.storage import profiles as profile_store
from gpumux.storage import store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Trial, TrialReport, utcnow
from gpumux.throughput import CurvePoint

TIMING = Timing(warmup=timedelta(seconds=5), window=timedelta(seconds=10))
COMMAND = ["python", "train.py"]
TOKENS = ["batch_size=32", "lr=1e-3..1e-1"]
NUMBERS = itertools.count(1)


@pytest.fixture
def trial_id(sessions: Sessions, tmp_path: Path) -> int:
    with sessions.write.begin() as session:
        owner = store.get_or_create_owner(session=session, name="alice")
        sweep = store.create_sweep(
            session=session,
            sweep_in=sweep_in(tmp_path, *TOKENS, command=COMMAND),
            owner=owner,
            seed=1,
            trial_params=[{}],
        )
        trial = store.list_trials(session=session, sweep_id=sweep.id)[0][0]
        trial.device = "cpu"
        return trial.id


def search_of(sessions: Sessions) -> SplitSearch:
    """The search of sweep 1's workload on the CPU device, as the daemon makes it."""
    with sessions.read() as session:
        sweep = store.get_sweep(session=session, sweep_id=1)
        assert sweep is not None
        return SplitSearch.resume(
            session=session,
            device_key="cpu",
            device_name="Test CPU",
            command=[sweep.workdir, *sweep.command],
            param_tokens=sweep.param_tokens,
            ceiling=8,
            timing=TIMING,
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
    sessions: Sessions, search: SplitSearch, trial_id: int, start: datetime, rate: float
) -> datetime:
    """N trials run for warm-up + window, reporting `rate` samples/s in all; returns the end."""
    split = search.split
    with sessions.write.begin() as session:
        search.observe(session=session, now=start, running=split, queued=9, sweep_id=1)
        trials = [running_trial(start - timedelta(seconds=1), split) for _ in range(split)]
        session.add_all(trials)
        session.flush()
        for second in range(1, 17):
            for trial in trials:
                at = start + timedelta(seconds=second)
                session.add(report(trial, at, rate / split))
        session.flush()
        end = start + TIMING.warmup + TIMING.window
        search.observe(session=session, now=end, running=split, queued=9, sweep_id=1)
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
    # Reports in the window (warm-up excluded) over the window's length.
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
        search.observe(
            session=session, now=now + timedelta(seconds=3), running=0, queued=0, sweep_id=1
        )
        assert search.phase_start is None and search.filling_since is None
        late = now + timedelta(seconds=60)
        search.observe(session=session, now=late, running=0, queued=0, sweep_id=1)
    assert search.curve == [] and search.split == 1


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
        stuck = start + TIMING.warmup + TIMING.window + timedelta(seconds=1)
        search.observe(session=session, now=stuck, running=1, queued=4, sweep_id=1)
    assert search.ceiling == 1 and search.decision.settled and search.split == 1


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


def test_a_long_trial_is_measured_once_it_reported_twice_after_the_warm_up(
    sessions: Sessions, trial_id: int
) -> None:
    search = search_of(sessions)
    start = utcnow()
    with sessions.write.begin() as session:
        search.observe(session=session, now=start, running=1, queued=5, sweep_id=1)
        trial = running_trial(start - timedelta(seconds=1), 1)
        session.add(trial)
        session.flush()
        session.add(report(trial, start + timedelta(seconds=3), 100.0))  # in its warm-up
        session.add(report(trial, start + TIMING.warmup + timedelta(seconds=2), 100.0))
        session.flush()
        later = start + TIMING.warmup + TIMING.window + timedelta(seconds=1)
        search.observe(session=session, now=later, running=1, queued=5, sweep_id=1)
        assert search.curve == [], "one report after the warm-up gives no rate"
        session.add(report(trial, start + timedelta(seconds=47), 600.0))
        session.flush()
        end = start + timedelta(seconds=50)
        search.observe(session=session, now=end, running=1, queued=5, sweep_id=1)
    (point,) = search.curve
    # What it reported after its first report past the warm-up, between the two.
    assert point.throughput == pytest.approx(600.0 / 40)
    assert search.split == 2


def test_a_script_that_reports_nothing_is_measured_as_n_over_the_trial_duration(
    sessions: Sessions, trial_id: int
) -> None:
    search = search_of(sessions)
    start = utcnow()
    with sessions.write.begin() as session:
        search.observe(session=session, now=start, running=1, queued=5, sweep_id=1)
        session.add(ended_trial(start, start + TIMING.warmup + timedelta(seconds=3)))
        session.flush()
        end = start + TIMING.warmup + TIMING.window
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
        # Fewer than N: that phase is over, and what it saw does not measure N.
        tick(start + timedelta(seconds=1), 0, [])
        begin = start + timedelta(seconds=2)
        tick(begin, 1, [700])
        tick(begin + timedelta(seconds=3), 1, [900])
        tick(begin + timedelta(seconds=4), 1, [])
        session.add(ended_trial(begin, begin + TIMING.warmup + timedelta(seconds=3)))
        session.flush()
        tick(begin + TIMING.warmup + TIMING.window, 1, [800])
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
