"""Several workloads on one device: each search keeps measuring from its own trials' rates."""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from fractions import Fraction
from pathlib import Path

import httpx
import pytest
from builders import bearer, cpu_snapshot, daemon_bearer, launched, sweep_plan
from ports import free_port

from gpumux.config import Settings
from gpumux.devices.snapshot import DeviceSnapshot
from gpumux.fields import MAX_SPLIT
from gpumux.scheduling.next_trials import next_trials
from gpumux.server.daemon import embedded
from gpumux.splits.curve import Decision
from gpumux.splits.mix import Mix, raised
from gpumux.splits.online import SplitSearch
from gpumux.splits.priors import resume_search
from gpumux.splits.searches import SplitSearches
from gpumux.splits.window import Timing, sweep_fingerprint
from gpumux.status import TrialStatus
from gpumux.storage import owners as owner_store
from gpumux.storage import profiles as profile_store
from gpumux.storage import sweeps as sweep_store
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions, make_engine, make_sessions
from gpumux.storage.models import Sweep, Trial, TrialReport, utcnow

TIMING = Timing(settle=timedelta(seconds=5), window=timedelta(seconds=10))
NUMBERS = itertools.count(100)


def make_sweep(sessions: Sessions, tmp_path: Path, script: str, trials: int = 1) -> int:
    """An auto sweep of `trials` trials of `python script` (its workload)."""
    with sessions.write.begin() as session:
        sweep = sweep_store.create_sweep(
            session=session,
            plan=sweep_plan(
                tmp_path,
                "x=1..9",
                command=["python", script],
                seed=1,
                trial_params=[{"x": n} for n in range(trials)],
            ),
            owner=owner_store.get_or_create_owner(session=session, name="alice"),
        )
        return sweep.id


def search_of(sessions: Sessions, sweep_id: int) -> SplitSearch:
    with sessions.read() as session:
        sweep = session.get(Sweep, sweep_id)
        assert sweep is not None
        return resume_search(
            session=session,
            device_key="cpu",
            device_name="Test CPU",
            command=[sweep.workdir, *sweep.command],
            param_tokens=sweep.param_tokens,
            ceiling=8,
            timing=TIMING,
        )


def running(sweep_id: int, split: int, started: datetime) -> Trial:
    """A trial of the sweep running on the CPU device under `split` since `started`."""
    return Trial(
        sweep_id=sweep_id,
        number=next(NUMBERS),
        params={},
        status=TrialStatus.running,
        device="cpu",
        split=split,
        started_at=started,
    )


def reports(trial: Trial, start: datetime, seconds: range, samples: float) -> list[TrialReport]:
    return [
        TrialReport(
            trial_id=trial.id,
            attempt=1,
            kind="batch",
            at=start + timedelta(seconds=second),
            samples=samples,
            seconds=1.0,
            metrics={},
        )
        for second in seconds
    ]


def test_a_workload_sharing_the_device_is_measured_as_n_times_its_median_trial_rate(
    sessions: Sessions, tmp_path: Path
) -> None:
    ours, theirs = make_sweep(sessions, tmp_path, "a.py"), make_sweep(sessions, tmp_path, "b.py")
    search = search_of(sessions, ours)
    search.decision = Decision(split=4, settled=False, reason="measuring N=4")
    # Two trials of ours at N=4 hold half the device; one of theirs at N=2 holds the rest.
    mix = Mix(shares=Fraction(1))
    start = utcnow()
    with sessions.write.begin() as session:
        search.observe(session=session, now=start, running=2, queued=3, sweep_id=ours, mix=mix)
        fast, slow = running(ours, 4, start), running(ours, 4, start)
        other = running(theirs, 2, start)
        session.add_all([fast, slow, other])
        session.flush()
        # A report a second from their start to the window's end: 30 and 20 samples/s of life.
        session.add_all(reports(fast, start, range(1, 16), 30.0))
        session.add_all(reports(slow, start, range(1, 16), 20.0))
        # The other workload's samples are not ours: they must not count.
        session.add_all(reports(other, start, range(1, 16), 5000.0))
        session.flush()
        end = start + TIMING.settle + TIMING.window
        search.observe(session=session, now=end, running=2, queued=3, sweep_id=ours, mix=mix)
    (point,) = search.curve
    # Each trial holds 1/4 of the device: 4 times the median of 30 and 20 samples/s.
    assert point.split == 4 and point.throughput == pytest.approx(4 * 25.0)


def test_a_phase_closes_once_every_trial_reported_twice_after_the_settle_time(
    sessions: Sessions, tmp_path: Path
) -> None:
    ours = make_sweep(sessions, tmp_path, "a.py")
    search = search_of(sessions, ours)
    search.decision = Decision(split=2, settled=False, reason="measuring N=2")
    start = utcnow()
    end = start + TIMING.settle + TIMING.window
    with sessions.write.begin() as session:
        search.observe(session=session, now=start, running=2, queued=3, sweep_id=ours)
        early, late = running(ours, 2, start), running(ours, 2, start)
        session.add_all([early, late])
        session.flush()
        session.add_all(reports(early, start, range(6, 16), 10.0))
        session.add_all(reports(late, start, range(8, 9), 10.0))
        session.flush()
        search.observe(session=session, now=end, running=2, queued=3, sweep_id=ours)
        assert search.curve == [], "one trial has reported once since the settle time"
        session.add_all(reports(late, start, range(16, 17), 80.0))
        session.flush()
        # No trial ended: the rates alone close the window.
        search.observe(
            session=session, now=end + timedelta(seconds=2), running=2, queued=3, sweep_id=ours
        )
    (point,) = search.curve
    # Each trial's steady rate from its first report to its last: 90 samples in 9 s, 80 in 8 s;
    # its start-up, its age at its last report less what it reported at that rate: 15 - 100 / 10
    # and 16 - 90 / 10 s. Read at what one trial does (the most either reported: 100), with the
    # medians: N trials, each 6 s starting and 100 / 10 s computing.
    assert (point.rate, point.startup_s) == pytest.approx((10.0, 6.0))
    assert point.throughput == pytest.approx(2 * 100 / (6 + 100 / 10))


def test_reports_read_together_give_no_rate(sessions: Sessions, tmp_path: Path) -> None:
    ours = make_sweep(sessions, tmp_path, "a.py")
    search = search_of(sessions, ours)
    start = utcnow()
    end = start + TIMING.settle + TIMING.window
    with sessions.write.begin() as session:
        search.observe(session=session, now=start, running=1, queued=3, sweep_id=ours)
        trial = running(ours, 1, start)
        session.add(trial)
        session.flush()
        # Two report lines read from its log in one tick: a millisecond apart.
        burst = start + timedelta(seconds=14)
        (first,) = reports(trial, burst, range(1), 100.0)
        (second,) = reports(trial, burst + timedelta(milliseconds=1), range(1), 100.0)
        session.add_all([first, second])
        session.flush()
        search.observe(session=session, now=end, running=1, queued=3, sweep_id=ours)
    assert search.curve == []


def test_a_device_with_room_a_waiting_trial_would_take_is_not_measured(
    sessions: Sessions, tmp_path: Path
) -> None:
    ours = make_sweep(sessions, tmp_path, "a.py")
    search = search_of(sessions, ours)
    start = utcnow()
    # A quarter of the device is free and a trial that takes a quarter waits: not full.
    room = Mix(shares=Fraction(3, 4), waiting=True, fitting=True)
    # The same quarter, with only trials of half a device waiting: as full as it gets.
    crowded = Mix(shares=Fraction(3, 4), waiting=True, fitting=False)
    with sessions.write.begin() as session:
        search.observe(session=session, now=start, running=1, queued=0, sweep_id=ours, mix=room)
        assert search.phase_start is None
        search.observe(session=session, now=start, running=1, queued=0, sweep_id=ours, mix=crowded)
        assert search.phase_start == start


def cpu() -> DeviceSnapshot:
    return cpu_snapshot(
        memory_total_mb=80_000, memory_used_mb=0, memory_free_mb=80_000, processes=()
    )


def test_two_workloads_on_one_device_both_keep_searching(
    sessions: Sessions, settings: Settings, tmp_path: Path
) -> None:
    first = make_sweep(sessions, tmp_path, "a.py", trials=4)
    second = make_sweep(sessions, tmp_path, "b.py", trials=4)
    searches = SplitSearches(settings)
    device = cpu()
    with sessions.read() as session:
        for sweep_id in (first, second):
            sweep = sweep_store.get_sweep(session=session, sweep_id=sweep_id)
            assert sweep is not None
            # Each starts at the device's 8 cores.
            assert searches.searched_splits(session=session, sweep=sweep, devices=[device]) == {
                "cpu": 8
            }
    # Both at N=2 share the device half and half, each trial reporting 40 samples/s of its
    # life, a report a second up to the moment the searches look.
    settle, window = settings.split_settle, settings.split_window
    look = int(settle + window) + 1
    start = utcnow()
    with sessions.write.begin() as session:
        for sweep_id in (first, second):
            trial = trial_store.list_trials(session=session, sweep_id=sweep_id)[0][0]
            launched(session, trial, running=True, device="cpu")
            trial.split, trial.started_at = 2, start
            session.add_all(reports(trial, start, range(1, look + 1), 40.0))
    for search in searches:
        search.decision = Decision(split=2, settled=False, reason="N=2")
    for elapsed in (0, look):
        with sessions.read() as session:
            waiting = [t.sweep for t in next_trials(session=session, limit=MAX_SPLIT)]
            searches.observe(
                session=session,
                now=start + timedelta(seconds=elapsed),
                waiting=waiting,
                devices=[device],
                group_of={},
            )
    assert [[(p.split, p.throughput) for p in search.curve] for search in searches] == [
        [(2, pytest.approx(80.0))],
        [(2, pytest.approx(80.0))],
    ]


def test_a_phase_pauses_while_only_another_workload_runs(
    sessions: Sessions, tmp_path: Path
) -> None:
    ours = make_sweep(sessions, tmp_path, "a.py")
    search = search_of(sessions, ours)
    start = utcnow()
    full = Mix(shares=Fraction(1))
    with sessions.write.begin() as session:
        search.observe(session=session, now=start, running=1, queued=3, sweep_id=ours, mix=full)
        trial = running(ours, 1, start)
        session.add(trial)
        session.flush()
        session.add_all(reports(trial, start, range(1, 12), 50.0))
        trial.status, trial.ended_at = TrialStatus.succeeded, start + timedelta(seconds=12)
        session.flush()
        # Its trial ended and another workload's holds the whole device: the phase pauses.
        pause = start + timedelta(seconds=13)
        search.observe(session=session, now=pause, running=0, queued=3, sweep_id=ours, mix=full)
        assert search.phase_start == start
        # Half of it, while our next trial waits for the whole device: still only a pause.
        half = Mix(shares=Fraction(1, 2), fitting=True, reserved=False)
        later = pause + timedelta(seconds=1)
        search.observe(session=session, now=later, running=0, queued=3, sweep_id=ours, mix=half)
        assert search.phase_start == start
        end = start + TIMING.settle + TIMING.window
        search.observe(session=session, now=end, running=0, queued=3, sweep_id=ours, mix=full)
    (point,) = search.curve
    assert (point.split, point.throughput) == (1, pytest.approx(50.0))


# Two workloads that any user can run (a shell, no Python of the test runner's): fixed work
# per step, so that a trial slows down as the cores get crowded, and a report line per step.
WORKLOADS = {
    "counts": "i=$((i+1))",
    "products": "i=$((i+1)); j=$((i*3%7))",
}
TRIAL = (
    "for step in $(seq 0 14); do i=0; while [ $i -lt 30000 ]; do {work}; done; "
    'echo "GPUMUX_REPORT {{\\"step\\": $step, \\"samples\\": 100}}"; done'
)


def peer_owner() -> str:
    """A second user for the second sweep, so that fair share alternates between the two:
    as root, trials run as their owner, who must exist (nobody); otherwise any name does."""
    if os.geteuid() != 0:
        return "mixing-peer"
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("needs the account nobody to run a second user's trials as root")
    return "nobody"


def test_two_auto_sweeps_share_the_cpu_by_their_shares_and_both_searches_learn(
    tmp_path: Path,
) -> None:
    port = free_port()
    settings = Settings(
        home=tmp_path / "home",
        url=f"http://127.0.0.1:{port}",
        poll_interval=0.2,
        kill_grace=2.0,
        split_settle=0.3,
        split_window=0.6,
    )
    # A directory the second user may enter (pytest's own are the test runner's only).
    workdir = Path(tempfile.mkdtemp(prefix="gpumux-mixing-"))
    workdir.chmod(0o755)
    peer = peer_owner()
    # Each search starts at the CPU's cores: enough trials to fill it at several N.
    trials = max(16, 8 * len(os.sched_getaffinity(0)))
    try:
        with embedded(settings) as daemon:
            sessions = make_sessions(make_engine(settings.database_url))
            owners = {"counts": daemon_bearer(settings.home), "products": bearer(sessions, peer)}
            sweeps = {}
            for name, headers in owners.items():
                with httpx.Client(base_url=daemon.url, timeout=30, headers=headers) as client:
                    created = client.post(
                        "/sweeps",
                        json={
                            "params": [f"x=1..{trials}"],
                            "command": ["sh", "-c", TRIAL.format(work=WORKLOADS[name])],
                            "workdir": str(workdir),
                            "env": dict(os.environ),
                        },
                    )
                    assert created.status_code == 201, created.text
                    assert created.json()["split"] == "auto"
                    sweeps[created.json()["id"]] = name
            watched = watch(sessions, sweeps)
            sessions.engine.dispose()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    assert watched.side_by_side, "the two sweeps never ran trials at the same time"
    # Neither search stalled: while both sweeps ran, each measured several N.
    assert sorted(watched.measured_together) == ["counts", "products"], watched
    assert all(len(points) >= 2 for points in watched.measured_together.values()), watched


@dataclass
class Watched:
    """What a test saw of two sweeps, one snapshot of the database at a time."""

    side_by_side: bool = False
    # Each workload's measured N, as its profile stood while both sweeps were open.
    measured_together: dict[str, list[int]] = field(default_factory=dict)


def watch(sessions: Sessions, sweeps: dict[int, str]) -> Watched:
    """Poll until both sweeps finish, checking that the CPU's shares never pass 1 (each trial
    counted at the highest N its sweep runs at: a raised N's slots are free at once)."""
    seen = Watched()
    fingerprints: dict[str, str] = {}
    deadline = time.monotonic() + 240
    while True:
        with sessions.read() as session:
            active = [t for t in trial_store.active_trials(session=session) if t.device is not None]
            # A trial of a lower N gives up its share beyond the N its sweep's search raised
            # (placement's credit): each counts at the highest N its sweep runs at there.
            highest: dict[tuple[int, str | None], int] = {}
            for t in active:
                key = (t.sweep_id, t.device)
                highest[key] = max(highest.get(key, 1), t.split or 1)
            held = sum(
                (Fraction(1, max(t.split or 1, highest[t.sweep_id, t.device])) for t in active),
                Fraction(0),
            )
            assert held <= 1, [(t.sweep_id, t.split) for t in active]
            if {t.sweep_id for t in active} == set(sweeps):
                seen.side_by_side = True
            open_ = {
                sweep_id
                for sweep_id in sweeps
                if (sweep := sweep_store.get_sweep(session=session, sweep_id=sweep_id)) is not None
                and sweep.finished_at is None
            }
            for sweep_id, name in sweeps.items():
                sweep = sweep_store.get_sweep(session=session, sweep_id=sweep_id)
                assert sweep is not None
                fingerprints[name] = sweep_fingerprint(sweep)
            if open_ == set(sweeps):
                profiles, _ = profile_store.list_profiles(session=session)
                for profile in profiles:
                    for name, fingerprint in fingerprints.items():
                        if profile.fingerprint == fingerprint:
                            seen.measured_together[name] = [p["split"] for p in profile.curve]
            if not open_:
                trials = [
                    t
                    for s in sweeps
                    for t in trial_store.list_trials(session=session, sweep_id=s, limit=100)[0]
                ]
                failed = [t for t in trials if t.status != TrialStatus.succeeded]
                assert not failed, [
                    (t.sweep.owner.name, t.error, Path(t.log_path or "").read_text())
                    for t in failed
                ]
                return seen
        assert time.monotonic() < deadline, f"the sweeps did not finish: {seen}"
        time.sleep(0.1)


@pytest.mark.parametrize(
    ("splits", "shares", "expected", "why"),
    [
        ({2: 2, 5: 3}, Fraction(2, 2) + Fraction(3, 5), True, "2 of N=2 and 3 of N=5, alone"),
        ({2: 2, 5: 2}, Fraction(2, 2) + Fraction(2, 5), False, "4 trials: not 5 of them yet"),
        ({5: 5}, Fraction(5, 5), False, "nothing left from a lower N: an ordinary phase"),
        ({2: 2, 8: 1, 5: 2}, 1 + Fraction(1, 8) + Fraction(2, 5), False, "left from a higher N"),
        ({2: 2, 5: 3}, Fraction(2, 2) + Fraction(3, 5) + Fraction(1, 4), False, "not alone"),
        ({2: 2, 5: 3, 8: 0}, Fraction(2, 2) + Fraction(3, 5), True, "a count of none is none"),
    ],
)
def test_a_raised_n_runs_its_n_trials_beside_a_lower_ns_alone(
    splits: dict[int, int], shares: Fraction, expected: bool, why: str
) -> None:
    assert raised(splits, split=5, shares=shares) is expected, why
