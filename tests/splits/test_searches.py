"""The daemon's split searches: one per device model and workload, the ceiling they search
under, and the memory of the trials they measure."""

from __future__ import annotations

import logging
import re
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from builders import launched, sweep_plan
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from gpumux.config import Settings
from gpumux.devices.accounting import Overheads
from gpumux.devices.snapshot import DeviceSnapshot, GpuProcess
from gpumux.fields import MAX_SPLIT
from gpumux.processes.procfs import group_members
from gpumux.scheduling.next_trials import next_trials
from gpumux.scheduling.placement import PackingPolicy, PendingTrial, plan
from gpumux.splits.curve import SEQUENCE, Decision
from gpumux.splits.online import SplitSearch
from gpumux.splits.searches import CONTEXT_MB, MAX_CONTEXT_MB, SplitSearches
from gpumux.splits.window import sweep_fingerprint
from gpumux.status import SweepStatus, TrialStatus
from gpumux.storage import lifecycle
from gpumux.storage import owners as owner_store
from gpumux.storage import profiles as profile_store
from gpumux.storage import sweeps as sweep_store
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import utcnow
from gpumux.throughput import CurvePoint

COMMAND = ["python", "train.py"]
TOTAL_MB = 80_000
# Room for one trial's smallest slice, its overhead and the reserve: a search there starts at N=1.
ONE_TRIAL_MB = 2048
HOG_MB = 64
# A process of the first wave's trial beside its leader (its group's, not a real one).
WORKER_PID = 2**22 + 1


def device(
    key: str = "cpu",
    name: str = "Test CPU",
    kind: str = "cpu",
    processes: tuple[GpuProcess, ...] = (),
    *,
    cores: int = 8,
    total_mb: int = TOTAL_MB,
) -> DeviceSnapshot:
    return DeviceSnapshot(
        key=key,
        kind=kind,
        index=0,
        name=name,
        uuid=key if kind == "gpu" else None,
        memory_total_mb=total_mb,
        memory_used_mb=0,
        memory_free_mb=total_mb,
        utilization_pct=None,
        processes=processes,
        cpu_count=cores if kind == "cpu" else None,
    )


def two_sweeps(sessions: Sessions, tmp_path: Path) -> tuple[int, int]:
    """An auto sweep of 6 trials and a fixed --split 2 sweep of 1, as the API stores them."""
    with sessions.write.begin() as session:
        owner = owner_store.get_or_create_owner(session=session, name="alice")
        auto = sweep_store.create_sweep(
            session=session,
            plan=sweep_plan(
                tmp_path,
                "x=1..6",
                command=COMMAND,
                seed=1,
                trial_params=[{"x": n} for n in range(6)],
            ),
            owner=owner,
        )
        fixed = sweep_store.create_sweep(
            session=session,
            plan=sweep_plan(tmp_path, split=2, seed=1, trial_params=[{}]),
            owner=owner,
        )
        return auto.id, fixed.id


def observe(
    searches: SplitSearches,
    session: Session,
    *,
    now: datetime,
    devices: list[DeviceSnapshot],
    group_of: Mapping[int, int],
) -> list[SplitSearch]:
    """What the scheduler does after a tick's placements: every search looks at its device."""
    waiting = [trial.sweep for trial in next_trials(session=session, limit=MAX_SPLIT)]
    return searches.observe(
        session=session, now=now, waiting=waiting, devices=devices, group_of=group_of
    )


def search_for(
    searches: SplitSearches, sessions: Sessions, sweep_id: int, on: DeviceSnapshot
) -> SplitSearch:
    with sessions.read() as session:
        sweep = sweep_store.get_sweep(session=session, sweep_id=sweep_id)
        assert sweep is not None
        return searches.search(session=session, sweep=sweep, device=on)


def following(
    sessions: Sessions, settings: Settings, tmp_path: Path
) -> tuple[int, SplitSearches, SplitSearch]:
    """The auto sweep, the searches, and the sweep's search on the CPU, following the sweep."""
    auto_id, _ = two_sweeps(sessions, tmp_path)
    searches = SplitSearches(settings)
    search = search_for(searches, sessions, auto_id, device())
    search.sweep_id = auto_id
    return auto_id, searches, search


def sweep_over(
    searches: SplitSearches,
    sessions: Sessions,
    sweep_id: int,
    status: SweepStatus,
    *,
    on: DeviceSnapshot,
) -> tuple[list[SplitSearch], list[SplitSearch]]:
    """The sweep is over (`status`): the searches that changed at the next look at `on`, and
    at the one after."""
    with sessions.write.begin() as session:
        sweep = sweep_store.get_sweep(session=session, sweep_id=sweep_id)
        assert sweep is not None
        sweep.status = status
    with sessions.read() as session:
        over = observe(searches, session, now=utcnow(), devices=[on], group_of={})
        return over, observe(searches, session, now=utcnow(), devices=[on], group_of={})


def run_first_trial(
    sessions: Sessions, sweep_id: int, *, device: str, pgid: int, split: int = 1
) -> None:
    """The sweep's first trial runs on `device` as the process group `pgid`, launched under
    `split`."""
    with sessions.write.begin() as session:
        trial = trial_store.list_trials(session=session, sweep_id=sweep_id)[0][0]
        launched(session, trial, running=True, device=device, pid=pgid, split=split)


@pytest.fixture
def hog() -> Iterator[subprocess.Popen[str]]:
    """A process group whose leader holds HOG_MB of memory it has written, until stdin closes."""
    script = (
        "import sys\n"
        f"held = b'x' * ({HOG_MB} << 20)\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as child:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        yield child
    # Leaving the block closed its stdin and waited for it.
    assert child.returncode == 0


def test_another_sweep_holding_the_device_never_lowers_the_searchs_ceiling(
    sessions: Sessions, settings: Settings, tmp_path: Path
) -> None:
    auto_id, fixed_id = two_sweeps(sessions, tmp_path)
    searches = SplitSearches(settings)
    with sessions.read() as session:
        sweep = sweep_store.get_sweep(session=session, sweep_id=auto_id)
        assert sweep is not None
        # Nothing measured yet: the search starts at the CPU's core count.
        assert searches.searched_splits(session=session, sweep=sweep, devices=[device()]) == {
            "cpu": 8
        }
    with sessions.write.begin() as session:
        (other,) = trial_store.list_trials(session=session, sweep_id=fixed_id)[0]
        launched(session, other, running=True, device="cpu")
    (search,) = searches
    ceiling = search.ceiling
    now = utcnow()
    for minute in range(10):
        with sessions.read() as session:
            changed = observe(
                searches,
                session,
                now=now + timedelta(minutes=minute),
                devices=[device()],
                group_of={},
            )
        assert changed == []
    assert search.ceiling == ceiling and search.phase_start is None and search.curve == []


def test_twin_gpus_share_one_search_measured_on_one_of_them(
    sessions: Sessions, settings: Settings, tmp_path: Path
) -> None:
    auto_id, _ = two_sweeps(sessions, tmp_path)
    searches = SplitSearches(settings.model_copy(update={"host_cores": 64}))
    few_cores = SplitSearches(settings.model_copy(update={"host_cores": 4}))
    twins = [device("GPU-a", "NVIDIA H200", "gpu"), device("GPU-b", "NVIDIA H200", "gpu")]
    with sessions.read() as session:
        sweep = sweep_store.get_sweep(session=session, sweep_id=auto_id)
        assert sweep is not None
        splits = searches.searched_splits(session=session, sweep=sweep, devices=twins)
        on_few = few_cores.searched_splits(session=session, sweep=sweep, devices=twins)
    # 62 trials of 256 + 1024 MB fit in 79,488 MB: the largest step within a quarter of that,
    # on a host of 64 cores, after a first wave of half of it; on one of 4, a trial per core.
    assert splits == {"GPU-a": 6, "GPU-b": 6}
    assert on_few == {"GPU-a": 4, "GPU-b": 4}
    (search,) = searches
    assert search.device_key == "GPU-a" and search.device_name == "NVIDIA H200"
    assert search.start == 13


def test_a_cpu_search_keeps_its_profile_per_model_and_cores(
    sessions: Sessions, settings: Settings, tmp_path: Path
) -> None:
    auto_id, _ = two_sweeps(sessions, tmp_path)
    search = search_for(SplitSearches(settings), sessions, auto_id, device())
    assert search.device_name == "Test CPU, 8 cores"
    # Two trials per core, as free memory allows at cpu_trial_mb each.
    assert search.ceiling == 16


def test_the_ceiling_divides_by_the_overhead_placement_budgets(
    sessions: Sessions, settings: Settings, tmp_path: Path
) -> None:
    auto_id, _ = two_sweeps(sessions, tmp_path)
    overheads = Overheads(configured_mb=settings.overhead_mb)
    searches = SplitSearches(settings, overheads=overheads)
    gpu = device("GPU-a", "NVIDIA H200", "gpu")
    room = TOTAL_MB - settings.reserve_mb
    assert searches.ceiling(gpu) == room // (settings.min_memory_mb + settings.overhead_mb)
    # A trial of ours (process group 4100, capped at 4096 MB) holds 3000 MB beyond its cap.
    seen = device("GPU-a", "NVIDIA H200", "gpu", (GpuProcess(pid=4100, used_memory_mb=7096),))
    overheads.observe([seen], group_of={4100: 4100}, caps={4100: 4096})
    assert overheads.for_device("GPU-a") == 3000
    search = search_for(searches, sessions, auto_id, gpu)
    assert search.ceiling == searches.ceiling(gpu) == room // (settings.min_memory_mb + 3000)
    policy = PackingPolicy(
        overhead_mb=overheads.configured_mb, overhead_by_device=overheads.measured()
    )
    (placed,) = plan(
        devices=[gpu], running=[], pending=[PendingTrial(trial_id=1, split=2)], policy=policy
    ).placements
    assert placed.memory_limit_mb == room // 2 - 3000


def test_an_overhead_measured_after_the_search_began_lowers_its_ceiling(
    sessions: Sessions, settings: Settings, tmp_path: Path
) -> None:
    auto_id, _ = two_sweeps(sessions, tmp_path)
    overheads = Overheads(configured_mb=settings.overhead_mb)
    searches = SplitSearches(settings, overheads=overheads)
    gpu = device("GPU-a", "NVIDIA H200", "gpu")
    search = search_for(searches, sessions, auto_id, gpu)
    before = search.ceiling
    # Measured once trials ran: 3000 MB beyond a 4096 MB cap, where 1024 MB were budgeted.
    seen = device("GPU-a", "NVIDIA H200", "gpu", (GpuProcess(pid=4100, used_memory_mb=7096),))
    overheads.observe([seen], group_of={4100: 4100}, caps={4100: 4096})
    with sessions.read() as session:
        observe(searches, session, now=utcnow(), devices=[gpu], group_of={})
    room = TOTAL_MB - settings.reserve_mb
    assert search.ceiling == room // (settings.min_memory_mb + 3000) < before
    assert all(point.split <= search.ceiling for point in search.curve)


def test_a_cpu_trial_is_measured_by_the_resident_memory_of_its_process_group(
    sessions: Sessions,
    settings: Settings,
    tmp_path: Path,
    hog: subprocess.Popen[str],
) -> None:
    auto_id, _ = two_sweeps(sessions, tmp_path)
    searches = SplitSearches(settings)
    cpu = device(cores=1)
    search = search_for(searches, sessions, auto_id, cpu)
    run_first_trial(sessions, auto_id, device="cpu", pgid=hog.pid)
    with sessions.read() as session:
        observe(searches, session, now=utcnow(), devices=[cpu], group_of=group_members({hog.pid}))
    assert search.phase_start is not None and search.peak_mb is not None
    # The bytes it wrote, and the interpreter around them.
    assert HOG_MB <= search.peak_mb < HOG_MB + 200


def test_a_gpu_trial_is_measured_by_what_nvml_says_its_processes_hold(
    sessions: Sessions,
    settings: Settings,
    tmp_path: Path,
    hog: subprocess.Popen[str],
) -> None:
    auto_id, _ = two_sweeps(sessions, tmp_path)
    searches = SplitSearches(settings)
    listed = (GpuProcess(pid=hog.pid, used_memory_mb=2500), GpuProcess(pid=1, used_memory_mb=900))
    gpu = device("GPU-a", "NVIDIA H200", "gpu", listed, total_mb=ONE_TRIAL_MB)
    search = search_for(searches, sessions, auto_id, gpu)
    run_first_trial(sessions, auto_id, device="GPU-a", pgid=hog.pid)
    with sessions.read() as session:
        observe(searches, session, now=utcnow(), devices=[gpu], group_of=group_members({hog.pid}))
    assert search.peak_mb == 2500


@dataclass
class FirstWave:
    """A search on an H100 whose guess is memory's, and the first trial of its first wave."""

    sessions: Sessions
    searches: SplitSearches
    search: SplitSearch
    trial: subprocess.Popen[str]
    group: dict[int, int]

    def holding(
        self, mb: int, *, worker_mb: int | None = None, at: datetime | None = None
    ) -> list[SplitSearch]:
        """The searches look at a new probe of the H100 with the trial holding `mb` (and a
        worker process of its group `worker_mb`), now or `at`: those that changed."""
        listed: tuple[GpuProcess, ...] = (GpuProcess(pid=self.trial.pid, used_memory_mb=mb),)
        if worker_mb is not None:
            listed += (GpuProcess(pid=WORKER_PID, used_memory_mb=worker_mb),)
        return self.looking(device("GPU-a", "NVIDIA H100", "gpu", listed), at=at)

    def looking(self, gpu: DeviceSnapshot, *, at: datetime | None = None) -> list[SplitSearch]:
        """The searches look at this probe of the H100, now or `at`: those that changed."""
        group = self.group | {WORKER_PID: self.trial.pid}
        now = at or utcnow()
        with self.sessions.read() as session:
            return observe(self.searches, session, now=now, devices=[gpu], group_of=group)

    def pooling(self, mb: int, *, read_at: datetime | None = None) -> None:
        """The trial's framework says (again) that its pool holds `mb`, read now or `read_at`."""
        with self.sessions.write.begin() as session:
            trial = trial_store.get_trial(session=session, trial_id=self.trial_id)
            assert trial is not None
            trial.pool_mb, trial.pool_at = mb, read_at or utcnow()
            trial.last_report_at = utcnow()

    def reporting(self, *, ever: bool = True) -> None:
        """The trial has reported, with no pool (`ever`), or has not reported yet."""
        with self.sessions.write.begin() as session:
            trial = trial_store.get_trial(session=session, trial_id=self.trial_id)
            assert trial is not None
            trial.last_report_at = utcnow() if ever else None

    @property
    def trial_id(self) -> int:
        with self.sessions.read() as session:
            (trial,) = trial_store.active_trials(session=session)
            return trial.id

    def fit_below(self, guess: int) -> tuple[int, int]:
        """What a trial holds (MiB) where fewer than the guess fit, yet more than its first
        wave, and the N that fits."""
        room = TOTAL_MB - self.searches.settings.reserve_mb
        overhead = self.searches.overheads.for_device("GPU-a")
        held = room // (guess - 1) + CONTEXT_MB - overhead
        fit = room // (held - CONTEXT_MB + overhead)
        assert guess // 2 < fit < guess
        return held, fit


@pytest.fixture
def first_wave(
    sessions: Sessions, settings: Settings, tmp_path: Path, hog: subprocess.Popen[str]
) -> FirstWave:
    """The auto sweep's search on an H100, its first trial running there as `hog`."""
    auto_id, _ = two_sweeps(sessions, tmp_path)
    # More host cores than a quarter of the memory's ceiling: the guess is memory's.
    searches = SplitSearches(settings.model_copy(update={"host_cores": MAX_SPLIT}))
    search = search_for(searches, sessions, auto_id, device("GPU-a", "NVIDIA H100", "gpu"))
    run_first_trial(sessions, auto_id, device="GPU-a", pgid=hog.pid, split=search.split)
    wave = FirstWave(sessions, searches, search, hog, group_members({hog.pid}))
    # It has reported, with no pool: its framework tells none (TensorFlow's, JAX's), and what
    # it holds is fitted by the assumed context at once.
    wave.reporting()
    return wave


def test_a_guess_from_memory_first_runs_half_whose_trials_bound_the_ceiling_by_what_they_hold(
    first_wave: FirstWave,
) -> None:
    search = first_wave.search
    guess = search.start
    assert guess > 2 and search.curve == []
    assert search.split == guess // 2, search.decision.reason
    assert search.decision.reason.startswith(f"learning what a trial holds at N={guess // 2}")

    # Starting up, the trial holds no more than a CUDA context: nothing learnt yet.
    first_wave.holding(CONTEXT_MB)
    assert search.split == guess // 2 and search.probe is not None

    # It allocated: the slices of N=fit hold it, fewer than the guess. The wave is measured
    # first (its point lets its trials be budgeted at the fit's slices), the climb then bounded
    # by the fit.
    held, fit = first_wave.fit_below(guess)
    assert first_wave.holding(held) == [search]
    assert search.probe is None and search.curve == []
    assert search.ceiling == fit and search.split == guess // 2, search.decision.reason
    assert search.decision.reason.startswith(f"measuring N={guess // 2}, the first wave")
    assert search.start == guess, "a fit below the guess leaves the start where it was"


def test_a_first_wave_whose_trials_hold_little_raises_the_start_to_what_memory_fits(
    first_wave: FirstWave,
) -> None:
    search = first_wave.search
    guess = search.start
    wave = search.split

    # The trial holds little: far more than the guess fit. The wave is still measured first;
    # the search then starts at the step within what fits and the host's cores, not at the
    # guess made when what a trial holds was not known.
    first_wave.holding(CONTEXT_MB + 300)
    cores = first_wave.searches.host_cores
    step = max(n for n in SEQUENCE if n < search.ceiling and n <= cores)
    assert step > guess
    assert search.split == wave and search.start == step, search.decision.reason
    assert f"started at N={step}: the step below the {search.ceiling} trials" in (
        search.decision.reason
    )


def test_a_raised_start_goes_back_to_the_guess_once_the_wave_takes_its_whole_slice(
    first_wave: FirstWave,
) -> None:
    search = first_wave.search
    guess, wave = search.start, search.split
    room = TOTAL_MB - first_wave.searches.settings.reserve_mb

    # Weights first, then the framework takes the whole slice: what it needs is unknown again.
    first_wave.holding(CONTEXT_MB + 300)
    assert search.start > guess
    first_wave.holding(room // wave)
    assert search.start == guess and search.split == wave, search.decision.reason


def test_a_raised_start_above_a_lowered_ceiling_drops_to_the_step_below_it(
    first_wave: FirstWave,
) -> None:
    search = first_wave.search
    guess = search.start
    first_wave.holding(CONTEXT_MB + 300)
    raised = search.start

    # Only some fit at once for a while (another process holds memory). A start at the new
    # ceiling stays, the search descends from it; above it, the start is the step below, from
    # which the search still descends (from a start above the ceiling it would not); at or
    # below the guess, the guess.
    search.lower_ceiling(raised, why="as many fit at once", keep=False)
    assert search.start == raised, search.decision.reason
    search.lower_ceiling(raised - 1, why="fewer fit at once", keep=False)
    below = max(n for n in SEQUENCE if n < raised - 1)
    assert search.start == (below if below > guess else guess), search.decision.reason
    search.lower_ceiling(guess, why="fewer still", keep=False)
    assert search.start == guess, search.decision.reason


def test_a_first_wave_that_takes_its_whole_slice_leaves_the_start_at_the_guess(
    first_wave: FirstWave,
) -> None:
    search = first_wave.search
    guess, wave = search.start, search.split
    room = TOTAL_MB - first_wave.searches.settings.reserve_mb

    # As TensorFlow does: what it takes says nothing of what it needs.
    first_wave.holding(room // wave)
    assert search.probe is None and search.split == wave, search.decision.reason
    assert search.start == guess, search.decision.reason


def test_a_first_wave_still_allocating_lowers_the_ceiling_again_before_a_point(
    first_wave: FirstWave,
) -> None:
    search = first_wave.search
    guess = search.start
    # Its weights first (a real framework's first reading): memory fits more than the guess.
    first_wave.holding(CONTEXT_MB + 300)
    assert search.probe is None and search.ceiling > guess, search.decision.reason
    # Then its activations and optimizer state: the ceiling drops to what fits of that, and
    # the start the first reading raised drops back to the guess.
    held, fit = first_wave.fit_below(guess)
    first_wave.holding(held)
    assert search.ceiling == fit and search.split == guess // 2, search.decision.reason
    assert search.start == guess, search.decision.reason


CONTEXT = 300
# The probes of one figure a context is measured over: the pool the second look saw, read
# between the first two (`SplitSearches._measure`).
PROBES = 3


@pytest.fixture
def said(caplog: pytest.LogCaptureFixture) -> Callable[[], list[int]]:
    """The contexts the searches have said they measured, in order."""
    caplog.set_level(logging.INFO, logger="gpumux.splits.searches")
    return lambda: [int(mb) for mb in re.findall(r"its CUDA context is (\d+) MiB", caplog.text)]


def test_the_context_is_measured_where_the_pool_was_read_since_the_figure_held_still(
    first_wave: FirstWave, said: Callable[[], list[int]]
) -> None:
    held = 8000
    # Until its framework says what its pool holds, nothing is measured.
    first_wave.holding(held)
    # Still allocating: what NVML shows moves between two probes.
    first_wave.pooling(held - CONTEXT - 200)
    first_wave.holding(held - 200)
    before = utcnow()
    first_wave.pooling(held - CONTEXT)
    first_wave.holding(held)
    # The same figure again, but the pool was read before the look that first saw it: the
    # trial may have allocated in between.
    first_wave.holding(held)
    first_wave.pooling(held - CONTEXT, read_at=before)
    first_wave.holding(held)
    assert said() == []
    # The pool read since, and the figure the same at the next probe: the rest of what NVML
    # shows is its context.
    first_wave.pooling(held - CONTEXT)
    first_wave.holding(held)
    assert said() == []
    first_wave.holding(held)
    assert said() == [CONTEXT]


def test_a_pool_freed_after_the_probe_measures_no_context_from_it(
    first_wave: FirstWave, said: Callable[[], list[int]]
) -> None:
    held = 8000
    for _ in range(PROBES - 1):
        first_wave.pooling(held - CONTEXT)
        first_wave.holding(held)
    # Its framework frees 400 MiB of its pool (PyTorch's `empty_cache`) after the next probe
    # and tells it before the look at that probe: NVML's figure is from before the free.
    first_wave.pooling(held - CONTEXT - 400)
    first_wave.holding(held)
    assert said() == [CONTEXT]


def test_a_look_at_the_same_probe_again_measures_nothing(
    first_wave: FirstWave, said: Callable[[], list[int]]
) -> None:
    held = 8000
    gpu = device("GPU-a", "NVIDIA H100", "gpu", (GpuProcess(first_wave.trial.pid, held),))
    first_wave.looking(gpu)
    # The scheduler looks again before the next probe: the figure did not hold still, it was
    # read once.
    first_wave.pooling(held - CONTEXT)
    first_wave.looking(gpu)
    assert said() == []
    for _ in range(PROBES - 1):
        first_wave.holding(held)
    assert said() == [CONTEXT]


def test_a_trial_of_several_processes_on_the_gpu_measures_no_context(
    first_wave: FirstWave, said: Callable[[], list[int]]
) -> None:
    held = 8000
    # Its leader and a worker that made a context of its own: the pool is one process's.
    for _ in range(3):
        first_wave.pooling(held - CONTEXT)
        first_wave.holding(held, worker_mb=900)
    assert said() == []
    # The worker gone, the leader alone measures it.
    for _ in range(PROBES):
        first_wave.pooling(held - CONTEXT)
        first_wave.holding(held)
    assert said() == [CONTEXT]


def test_two_workloads_on_one_gpu_each_measure_their_own_context(
    first_wave: FirstWave, tmp_path: Path, said: Callable[[], list[int]]
) -> None:
    sessions = first_wave.sessions
    with sessions.write.begin() as session:
        owner = owner_store.get_or_create_owner(session=session, name="alice")
        plan = sweep_plan(tmp_path, "x=1..2", command=["python", "other.py"], seed=1)
        other_id = sweep_store.create_sweep(session=session, plan=plan, owner=owner).id
    gpu = device("GPU-a", "NVIDIA H100", "gpu")
    other = search_for(first_wave.searches, sessions, other_id, gpu)
    assert other is not first_wave.search
    run_first_trial(sessions, other_id, device="GPU-a", pgid=WORKER_PID, split=other.split)
    for _ in range(PROBES):
        with sessions.write.begin() as session:
            for trial in trial_store.active_trials(session=session):
                trial.pool_mb, trial.pool_at = 1000, utcnow()
        listed = (GpuProcess(first_wave.trial.pid, 1300), GpuProcess(WORKER_PID, 1450))
        with sessions.read() as session:
            observe(
                first_wave.searches,
                session,
                now=utcnow(),
                devices=[device("GPU-a", "NVIDIA H100", "gpu", listed)],
                group_of=first_wave.group | {WORKER_PID: WORKER_PID},
            )
    assert sorted(said()) == [300, 450]


def test_each_new_largest_context_is_said_a_smaller_one_later_is_not(
    first_wave: FirstWave, said: Callable[[], list[int]]
) -> None:
    # Its context made and nothing allocated in its pool yet: a context; then a larger one
    # (kernels loaded since); then a smaller one (a pool read after it grew), which is not.
    for context in (200, CONTEXT_MB + 300, 250):
        for _ in range(PROBES):
            first_wave.pooling(50)
            first_wave.holding(50 + context)
    assert said() == [200, CONTEXT_MB + 300]
    assert first_wave.search.context_mb == CONTEXT_MB + 300


def test_a_pool_told_before_an_allocation_measures_no_context_beyond_any(
    first_wave: FirstWave, said: Callable[[], list[int]]
) -> None:
    held = MAX_CONTEXT_MB + 1
    # Told empty at CUDA's start, then never again as it allocated (a script whose own
    # reports carry no pool): what it holds beyond that is no context.
    first_wave.pooling(0)
    for _ in range(3):
        first_wave.holding(held)
        first_wave.pooling(0)
    assert said() == []
    # A figure of no more than a context is one.
    for _ in range(PROBES):
        first_wave.holding(MAX_CONTEXT_MB)
        first_wave.pooling(0)
    assert said() == [MAX_CONTEXT_MB]


def test_the_first_wave_is_fitted_by_its_measured_context_once_measured(
    first_wave: FirstWave, said: Callable[[], list[int]]
) -> None:
    search, searches = first_wave.search, first_wave.searches
    guess, wave = search.start, search.split
    room = TOTAL_MB - searches.settings.reserve_mb
    # A trial that holds more than slices of the guess fit with its measured context beside
    # them, and less than with the assumed context and the configured overhead.
    held = room // (guess - 2) - 200
    configured = searches.overheads.for_device("GPU-a")
    measured_fit = room // held
    assumed_fit = room // (held - CONTEXT_MB + configured)
    assert wave < assumed_fit < measured_fit < guess <= search.ceiling
    assert room // (held - CONTEXT_MB + CONTEXT) > measured_fit, "the context subtracted counts"
    # Its framework told its pool: what it holds fits no N until its context is measured.
    first_wave.pooling(held - CONTEXT)
    first_wave.holding(held)
    assert search.probe == wave and search.ceiling >= guess, search.decision.reason
    for _ in range(PROBES - 1):
        first_wave.pooling(held - CONTEXT)
        first_wave.holding(held)
    assert said() == [CONTEXT] and search.context_mb == CONTEXT
    # Measured, each trial is budgeted its context beside its slice, and the fit is by both.
    assert searches.overheads.for_device("GPU-a", search.context_mb) == CONTEXT
    assert search.probe is None and search.ceiling == measured_fit, search.decision.reason


def test_a_first_wave_holding_less_than_the_assumed_context_allocated_beyond_its_measured_one(
    first_wave: FirstWave, said: Callable[[], list[int]]
) -> None:
    search = first_wave.search
    assert CONTEXT + 100 < CONTEXT_MB
    for _ in range(PROBES):
        first_wave.pooling(100)
        first_wave.holding(CONTEXT + 100)
    assert said() == [CONTEXT]
    assert search.probe is None and search.start > search.split, search.decision.reason


def test_a_first_wave_that_has_not_reported_waits_for_a_pool_it_may_tell(
    first_wave: FirstWave,
) -> None:
    search = first_wave.search
    wave = search.split
    held, fit = first_wave.fit_below(search.start)
    first_wave.reporting(ever=False)
    first_wave.holding(held)
    assert search.probe == wave and search.ceiling > fit, search.decision.reason
    # Its first report tells no pool: none will be measured, and the fit waits no longer.
    first_wave.reporting()
    first_wave.holding(held)
    assert search.probe is None and search.ceiling == fit, search.decision.reason


def test_a_first_wave_whose_window_closes_while_its_fit_waits_is_fitted_at_its_own_n(
    first_wave: FirstWave, monkeypatch: pytest.MonkeyPatch
) -> None:
    search = first_wave.search
    wave = search.split
    held, fit = first_wave.fit_below(search.start)
    # The wave's window closes in the tick its fit waits for a context (a pool told, NVML's
    # figure not yet held still), as `SplitSearch._close` closes one: the learning ends, the
    # wave is a point, and the search goes on at its start.
    observe_search = search.observe

    def window_closing(**kwargs: Any) -> None:
        observe_search(**kwargs)
        search.learned(why=f"the window of N={wave} closed")
        search.curve, search.probed = [CurvePoint(split=wave, throughput=100.0 * wave)], None
        search.decision = search.decide()

    monkeypatch.setattr(search, "observe", window_closing)
    first_wave.pooling(held - CONTEXT)
    first_wave.holding(held)
    # Fitted in that tick by what is known (the assumed context), at the wave's N, not at the
    # start's the search went on to.
    assert search.split > wave
    assert search.probe is None and search.ceiling == fit, search.decision.reason


def test_the_first_wave_waits_for_its_context_a_settle_and_a_window_at_most(
    first_wave: FirstWave, said: Callable[[], list[int]]
) -> None:
    search, timing = first_wave.search, first_wave.searches.timing
    wave = search.split
    held, fit = first_wave.fit_below(search.start)
    # The trial tells its pool, but what NVML shows of it never holds still: no context is
    # measured, and the fit waits no longer than a settle and a window for one.
    first_wave.pooling(held - CONTEXT)
    start = utcnow()
    first_wave.holding(held, at=start)
    first_wave.pooling(held - CONTEXT)
    first_wave.holding(held + 1, at=start + timing.settle + timing.window - timedelta(seconds=1))
    assert search.probe == wave and search.ceiling > fit, search.decision.reason
    first_wave.pooling(held - CONTEXT)
    first_wave.holding(held, at=start + timing.settle + timing.window)
    assert said() == []
    # Fitted by the assumed context and the configured overhead.
    assert search.probe is None and search.ceiling == fit, search.decision.reason


def contexts_of(searches: SplitSearches, sessions: Sessions) -> dict[tuple[str, int], int]:
    """The contexts the searches give placement for every sweep stored, on twin H100s, an
    A100, and an H100 whose probe failed (none: nothing is placed there)."""
    failed = replace(device("GPU-d", "NVIDIA H100", "gpu"), error="NVML failed")
    gpus = [*(device(key, name, "gpu") for key, name in GPUS), failed]
    with sessions.read() as session:
        sweeps, _ = sweep_store.list_sweeps(session=session)
        return searches.contexts(sweeps, session=session, devices=gpus)


GPUS = (("GPU-a", "NVIDIA H100"), ("GPU-b", "NVIDIA H100"), ("GPU-c", "NVIDIA A100"))


def test_a_measured_context_is_budgeted_on_every_device_of_the_model_and_kept_in_the_profile(
    first_wave: FirstWave, tmp_path: Path
) -> None:
    sessions, searches = first_wave.sessions, first_wave.searches
    with sessions.read() as session:
        auto_id = trial_store.active_trials(session=session)[0].sweep_id
    # The search serves its twin GPU too; another model's GPU is another search's.
    assert search_for(searches, sessions, auto_id, device("GPU-b", "NVIDIA H100", "gpu")) is (
        first_wave.search
    )
    search_for(searches, sessions, auto_id, device("GPU-c", "NVIDIA A100", "gpu"))
    assert contexts_of(searches, sessions) == {}
    for _ in range(PROBES):
        first_wave.pooling(5000)
        changed = first_wave.holding(5000 + CONTEXT)
    assert changed == [first_wave.search] and first_wave.search.context_mb == CONTEXT
    # The auto sweep's trials, on either H100; not the other sweep's (another workload's), nor
    # on the A100.
    assert contexts_of(searches, sessions) == {
        ("GPU-a", auto_id): CONTEXT,
        ("GPU-b", auto_id): CONTEXT,
    }
    # A larger one, changing nothing else, is the search's change too: its profile keeps it.
    decision = first_wave.search.decision
    first_wave.pooling(4900)
    assert first_wave.holding(5000 + CONTEXT) == []
    assert first_wave.holding(5000 + CONTEXT) == [first_wave.search]
    assert first_wave.search.decision == decision and first_wave.search.context_mb == CONTEXT + 100
    with sessions.write.begin() as session:
        first_wave.search.save(session=session)
    # A restarted daemon budgets it from the profile, before any search of the workload is
    # made (its trials running, none waiting), for a fixed sweep of the workload too, on
    # every H100; then from the search, which resumes with it.
    with sessions.write.begin() as session:
        owner = owner_store.get_or_create_owner(session=session, name="alice")
        plan = sweep_plan(tmp_path, split=4, command=COMMAND, seed=1, trial_params=[{}])
        fixed_id = sweep_store.create_sweep(session=session, plan=plan, owner=owner).id
    again = SplitSearches(searches.settings)
    stored = {
        (key, sweep_id): CONTEXT + 100
        for key in ("GPU-a", "GPU-b")
        for sweep_id in (auto_id, fixed_id)
    }
    assert contexts_of(again, sessions) == stored
    search = search_for(again, sessions, auto_id, device("GPU-b", "NVIDIA H100", "gpu"))
    assert search.context_mb == CONTEXT + 100
    assert contexts_of(again, sessions) == stored


def test_a_search_settled_by_its_profile_saves_the_context_it_measures_and_nothing_else(
    sessions: Sessions, settings: Settings, tmp_path: Path, hog: subprocess.Popen[str]
) -> None:
    auto_id, _ = two_sweeps(sessions, tmp_path)
    # As `gpumux tune` stores it: its points without steady rates (a search does not read
    # them: its curve here is empty), its own reason.
    tuned = [CurvePoint(split=n, throughput=1000.0 * n) for n in (1, 13, 40)]
    with sessions.write.begin() as session:
        sweep = sweep_store.get_sweep(session=session, sweep_id=auto_id)
        assert sweep is not None
        profile_store.save_profile(
            session=session,
            device_name="NVIDIA H100",
            fingerprint=sweep_fingerprint(sweep),
            workdir=sweep.workdir,
            command=list(sweep.command),
            param_tokens=sweep.param_tokens,
            unit="samples/s",
            curve=[p.to_json() for p in tuned],
            best_split=40,
            settled=True,
            reason="tuned: N=40",
            sweep_id=None,
        )
    searches = SplitSearches(settings.model_copy(update={"host_cores": MAX_SPLIT}))
    search = search_for(searches, sessions, auto_id, device("GPU-a", "NVIDIA H100", "gpu"))
    assert search.decision.settled and search.split == 40 and search.curve == []
    run_first_trial(sessions, auto_id, device="GPU-a", pgid=hog.pid, split=search.split)
    wave = FirstWave(sessions, searches, search, hog, group_members({hog.pid}))
    for _ in range(PROBES):
        wave.pooling(5000)
        changed = wave.holding(5000 + CONTEXT)
    assert changed == [search] and search.context_mb == CONTEXT
    with sessions.write.begin() as session:
        search.save(session=session)
    with sessions.read() as session:
        profile = profile_store.get_profile(
            session=session, device_name="NVIDIA H100", fingerprint=search.fingerprint
        )
        assert profile is not None
        assert (profile.best_split, profile.reason, profile.context_mb) == (
            40,
            "tuned: N=40",
            CONTEXT,
        )
        assert [CurvePoint.from_json(p) for p in profile.curve] == tuned


def test_a_settled_search_still_measures_its_workloads_context(first_wave: FirstWave) -> None:
    search = first_wave.search
    for _ in range(PROBES):
        first_wave.pooling(5000)
        first_wave.holding(5000 + CONTEXT)
    # Settled (as a profile from before a framework's upgrade resumes), its trials now show a
    # larger context: the search takes it, and its profile is saved with it.
    search.decision = Decision(split=search.split, settled=True, reason="settled before")
    first_wave.pooling(4800)
    first_wave.holding(5000 + CONTEXT)
    assert first_wave.holding(5000 + CONTEXT) == [search]
    assert search.context_mb == CONTEXT + 200 and search.decision.reason == "settled before"


def test_a_first_wave_that_ran_out_of_memory_is_not_run_again_by_the_next_search(
    sessions: Sessions, settings: Settings, tmp_path: Path
) -> None:
    auto_id, _ = two_sweeps(sessions, tmp_path)
    searches = SplitSearches(settings.model_copy(update={"host_cores": MAX_SPLIT}))
    gpu = device("GPU-a", "NVIDIA H100", "gpu")
    search = search_for(searches, sessions, auto_id, gpu)
    wave = search.split
    assert search.probe == wave
    with sessions.write.begin() as session:
        search.out_of_memory(session=session, split=wave)
    # A restarted daemon: the profile has no point, only the N that ran out of memory.
    again = search_for(SplitSearches(searches.settings), sessions, auto_id, gpu)
    assert again.probe is None and again.split < wave, again.decision.reason


def test_a_guess_from_the_hosts_cores_has_no_smaller_first_wave(
    sessions: Sessions, settings: Settings, tmp_path: Path
) -> None:
    auto_id, _ = two_sweeps(sessions, tmp_path)
    searches = SplitSearches(settings.model_copy(update={"host_cores": 4}))
    search = search_for(searches, sessions, auto_id, device("GPU-a", "NVIDIA H200", "gpu"))
    assert search.probe is None and search.split == search.start == 4, search.decision.reason


def test_without_the_device_listed_no_memory_is_measured(
    sessions: Sessions,
    settings: Settings,
    tmp_path: Path,
    hog: subprocess.Popen[str],
) -> None:
    auto_id, _ = two_sweeps(sessions, tmp_path)
    searches = SplitSearches(settings)
    search = search_for(searches, sessions, auto_id, device(cores=1))
    run_first_trial(sessions, auto_id, device="cpu", pgid=hog.pid)
    with sessions.read() as session:
        observe(searches, session, now=utcnow(), devices=[], group_of={})
    assert search.phase_start is not None and search.peak_mb is None


def test_a_search_that_fails_leaves_the_others_searching(
    sessions: Sessions, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    auto_id, _ = two_sweeps(sessions, tmp_path)
    with sessions.write.begin() as session:
        other = sweep_store.create_sweep(
            session=session,
            plan=sweep_plan(
                tmp_path,
                "y=1..2",
                command=["python", "other.py"],
                seed=1,
                trial_params=[{"y": 1}, {"y": 2}],
            ),
            owner=owner_store.get_or_create_owner(session=session, name="alice"),
        )
        other_id = other.id
    searches = SplitSearches(settings)
    cpu, gpu = device(cores=1), device("GPU-a", "NVIDIA H200", "gpu", total_mb=ONE_TRIAL_MB)
    broken = search_for(searches, sessions, auto_id, cpu)
    healthy = search_for(searches, sessions, other_id, gpu)

    def fail(**_: object) -> None:
        raise ValueError("a defect in one search")

    monkeypatch.setattr(broken, "observe", fail)
    run_first_trial(sessions, auto_id, device="cpu", pgid=1)
    run_first_trial(sessions, other_id, device="GPU-a", pgid=2)
    with sessions.read() as session:
        observe(searches, session, now=utcnow(), devices=[cpu, gpu], group_of={})
    assert healthy.phase_start is not None
    assert broken.phase_start is None


def test_a_database_failure_in_a_search_fails_the_tick_instead_of_being_logged_as_its_defect(
    sessions: Sessions, settings: Settings, tmp_path: Path
) -> None:
    auto_id, _ = two_sweeps(sessions, tmp_path)
    searches = SplitSearches(settings)
    cpu = device(cores=1)
    search = search_for(searches, sessions, auto_id, cpu)
    run_first_trial(sessions, auto_id, device="cpu", pgid=1)
    now = utcnow()
    with sessions.read() as session:
        observe(searches, session, now=now, devices=[cpu], group_of={})
    assert search.phase_start is not None
    # The look once the window opens reads the reports: a database that cannot answer fails.
    with sqlite3.connect(settings.database_file or "") as broken:
        broken.execute("DROP TABLE trial_reports")
    later = now + timedelta(seconds=settings.split_settle + settings.split_window)
    with sessions.read() as session, pytest.raises(OperationalError, match="trial_reports"):
        observe(searches, session, now=later, devices=[cpu], group_of={})


def test_a_sweep_that_ends_unsettled_leaves_its_search_saying_so(
    sessions: Sessions, settings: Settings, tmp_path: Path
) -> None:
    auto_id, searches, search = following(sessions, settings, tmp_path)
    cpu = device()
    with sessions.read() as session:
        queued = observe(searches, session, now=utcnow(), devices=[cpu], group_of={})
    with sessions.write.begin() as session:
        for trial in trial_store.list_trials(session=session, sweep_id=auto_id)[0]:
            lifecycle.set_trial_status(session=session, trial=trial, status=TrialStatus.cancelled)
        sweep = sweep_store.get_sweep(session=session, sweep_id=auto_id)
        assert sweep is not None
        # An adaptive sweep between two asks: nothing runs or waits, yet it goes on.
        sweep.status = SweepStatus.running
    with sessions.read() as session:
        between = observe(searches, session, now=utcnow(), devices=[cpu], group_of={})
    ended, again = sweep_over(searches, sessions, auto_id, SweepStatus.cancelled, on=cpu)

    assert queued == between == [], "its trials wait, or its sweep goes on: nothing to say yet"
    assert ended == [search] and again == []
    assert search.decision.reason.startswith("unsettled: the sweep ended after 0 point(s)")


def test_a_settled_search_times_its_points_by_the_trials_that_ended_once_its_sweep_is_over(
    sessions: Sessions, settings: Settings, tmp_path: Path
) -> None:
    auto_id, searches, search = following(sessions, settings, tmp_path)
    cpu = device()
    # Measured while its long trials ran: no trial had ended when the window closed.
    search.curve = [CurvePoint(split=2, throughput=10.0), CurvePoint(split=3, throughput=10.1)]
    search.decision = Decision(split=2, settled=True, reason="knee")
    started = utcnow() - timedelta(minutes=5)
    with sessions.write.begin() as session:
        trials = trial_store.list_trials(session=session, sweep_id=auto_id)[0]
        for trial, seconds, status in zip(
            trials,
            [60, 80, 100, 90, 5, 70],
            [*[TrialStatus.succeeded] * 4, TrialStatus.failed, TrialStatus.succeeded],
            strict=True,
        ):
            trial.status, trial.device = status, "cpu"
            trial.split = 2 if seconds != 70 else 3
            trial.started_at, trial.ended_at = started, started + timedelta(seconds=seconds)
    with sessions.read() as session:
        running = observe(searches, session, now=utcnow(), devices=[cpu], group_of={})
    over, again = sweep_over(searches, sessions, auto_id, SweepStatus.finished, on=cpu)

    assert running == [], "its sweep goes on: its trials have not all ended"
    assert over == [search] and again == []
    # The median of the trials that ran to their end under each N (the failed one left out).
    assert [p.seconds_per_trial for p in search.curve] == [85.0, 70.0]
    assert search.decision.settled and search.split == 2


def test_a_workloads_peak_is_the_most_its_measured_points_saw_not_a_phase_still_open(
    sessions: Sessions, settings: Settings, tmp_path: Path
) -> None:
    auto_id, searches, search = following(sessions, settings, tmp_path)
    with sessions.read() as session:
        sweep = sweep_store.get_sweep(session=session, sweep_id=auto_id)
        assert sweep is not None
        # Nothing seen yet, or not searched on that device: nothing to go by.
        assert searches.peak_mb(sweep=sweep, device_key="cpu") is None
        assert searches.peak_mb(sweep=sweep, device_key="GPU-9") is None
        # A phase not measured yet: its readings so far are no peak.
        search.peak_mb = 3500
        assert searches.peak_mb(sweep=sweep, device_key="cpu") is None
        search.curve = [
            CurvePoint(split=2, throughput=1.0, memory_per_trial_mb=3000),
            CurvePoint(split=4, throughput=1.5, memory_per_trial_mb=None),
        ]
        assert searches.peak_mb(sweep=sweep, device_key="cpu") == 3000


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
def test_a_raised_n_is_measured_beside_a_lower_ns_trials_on_a_gpu_by_its_own_memory(
    sessions: Sessions, settings: Settings, tmp_path: Path, kind: str
) -> None:
    auto_id, _ = two_sweeps(sessions, tmp_path)
    searches = SplitSearches(settings)
    # Pids that need not exist: NVML's listing is all a GPU trial's memory is read from.
    pids = {2: (9001, 9002), 3: (9003,)}
    held = {9001: 6000, 9002: 6000, 9003: 2500}
    listed = tuple(GpuProcess(pid=pid, used_memory_mb=mb) for pid, mb in held.items())
    on = device("GPU-a", "NVIDIA H100", "gpu", listed) if kind == "gpu" else device()
    search = search_for(searches, sessions, auto_id, on)
    search.probe = None
    search.decision = Decision(split=3, settled=False, reason="measuring N=3")
    with sessions.write.begin() as session:
        trials, _ = trial_store.list_trials(session=session, sweep_id=auto_id)
        # Two trials left from N=2, and the one N=3's credit let start beside them.
        launches = [(split, pid) for split in pids for pid in pids[split]]
        for trial, (split, pid) in zip(trials[: len(launches)], launches, strict=True):
            launched(session, trial, running=True, device=on.key, split=split, pid=pid, slot=pid)

    with sessions.read() as session:
        observe(searches, session, now=utcnow(), devices=[on], group_of={p: p for p in held})

    if kind == "gpu":
        # 3 trials share the card: N=3's phase begins, what its own trial holds its peak.
        assert search.phase_start is not None and search.peak_mb == 2500
    else:
        # The CPU's trials of N=2 hold twice the threads of N=3's: N=3 waits for them to end.
        assert search.phase_start is None
