from __future__ import annotations

import asyncio
import getpass
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from builders import kill_processes_naming, planned, sweep_in
from scripted_nvml import (
    H100_MB,
    H100_NAME,
    ScriptedGpu,
    ScriptedNvml,
    ScriptedProcess,
    scripted_nvml,
)

from gpumux.config import Settings
from gpumux.devices.kinds.base import pinned_cores
from gpumux.devices.probes import CpuProbe, DeviceProbe, NvmlProbe
from gpumux.devices.snapshot import DeviceSnapshot, core_blocks
from gpumux.grammar import sweepspec
from gpumux.processes import rundir
from gpumux.processes.procfs import start_ticks as process_start_ticks
from gpumux.scheduling.loop import Scheduler
from gpumux.status import SweepStatus, TrialStatus
from gpumux.storage import lifecycle
from gpumux.storage import owners as owner_store
from gpumux.storage import reports as report_store
from gpumux.storage import sweeps as sweep_store
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Trial

FIXTURES = Path(__file__).parents[1] / "fixtures"
DEADLINE = 60.0


class Harness:
    """A real scheduler over the test database, with helpers to submit and inspect."""

    def __init__(
        self,
        settings: Settings,
        sessions: Sessions,
        tmp_path: Path,
        probe: DeviceProbe | None = None,
    ) -> None:
        self.sessions = sessions
        self.tmp_path = tmp_path
        self.scheduler = Scheduler(
            settings=settings,
            sessions=sessions,
            probe=probe or CpuProbe(),
            url="http://127.0.0.1:9",
        )

    def submit(self, *params: str, command: list[str], **fields: object) -> int:
        sweep = sweep_in(self.tmp_path, *params, command=command, **fields)
        trial_params = sweepspec.expand(
            sweepspec.parse_params(sweep.params), trials=None, seed=1, max_grid=100
        )
        with self.sessions.write.begin() as session:
            owner = owner_store.get_or_create_owner(session=session, name=getpass.getuser())
            return sweep_store.create_sweep(
                session=session, plan=planned(sweep, seed=1, trial_params=trial_params), owner=owner
            ).id

    def trials(self, sweep_id: int) -> list[Trial]:
        with self.sessions.read() as session:
            return trial_store.list_trials(session=session, sweep_id=sweep_id)[0]

    def sweep_status(self, sweep_id: int) -> SweepStatus:
        with self.sessions.read() as session:
            sweep = sweep_store.get_sweep(session=session, sweep_id=sweep_id)
            assert sweep is not None
            return sweep.status

    def mark_running(self, sweep_id: int, *, pid: int, started: int | None) -> None:
        """Record the sweep's first trial as running as `pid`, as a dead daemon leaves it."""
        with self.sessions.write.begin() as session:
            trial = trial_store.list_trials(session=session, sweep_id=sweep_id)[0][0]
            lifecycle.set_trial_status(session=session, trial=trial, status=TrialStatus.starting)
            lifecycle.set_trial_status(
                session=session,
                trial=trial,
                status=TrialStatus.running,
                pid=pid,
                pid_started=started,
            )

    def cancel(self, sweep_id: int) -> None:
        with self.sessions.write.begin() as session:
            sweep = sweep_store.get_sweep(session=session, sweep_id=sweep_id)
            assert sweep is not None
            sweep_store.request_cancel(session=session, sweep=sweep)
        self.scheduler.wake()


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait for a condition that the running scheduler will bring about, with a deadline."""
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def gone(pid: int) -> bool:
    """The process no longer runs (a zombie runs nothing; PID 1 here may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def wait_for_file(path: Path, what: str) -> None:
    """Wait for a file that a process outside the test's control writes, with a deadline."""
    deadline = time.monotonic() + DEADLINE
    while not path.exists():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def supervisor_pid(settings: Settings, trial: Trial) -> int:
    """The pid of the supervisor of the trial's current attempt, as its run directory says."""
    record = json.loads(
        (settings.layout.runs / f"{trial.id}.{trial.attempt}" / "supervisor.json").read_text()
    )
    return int(record["pid"])


def wait_gone(pids: list[int]) -> list[int]:
    """The pids still running once they all ended or 10 s passed (SIGKILL needs a moment)."""
    deadline = time.monotonic() + 10
    while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [pid for pid in pids if not gone(pid)]


@pytest.fixture
def harness(settings: Settings, sessions: Sessions, tmp_path: Path) -> Harness:
    return Harness(settings, sessions, tmp_path)


@pytest.fixture(autouse=True)
def no_strays(tmp_path: Path) -> Iterator[None]:
    """Whatever a failed test leaves running (supervisors, trials) is killed at its end."""
    yield
    kill_processes_naming(tmp_path)


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


def test_a_crashing_trial_fails_with_its_code_and_log_while_others_finish(harness: Harness) -> None:
    sweep_id = harness.submit(
        "code=0,3", "n=1,2", command=[sys.executable, str(FIXTURES / "crash.py")], split=2
    )
    asyncio.run(harness.scheduler.run_until_idle())
    by_code: dict[int, list[Trial]] = {0: [], 3: []}
    for trial in harness.trials(sweep_id):
        by_code[trial.params["code"]].append(trial)
    assert [t.status for t in by_code[0]] == [TrialStatus.succeeded] * 2
    for crashed in by_code[3]:
        assert crashed.status == TrialStatus.failed and crashed.exit_code == 3
        assert crashed.error is not None
        assert "exited with code 3" in crashed.error
        assert "crash: giving up with code 3" in crashed.error
        assert "crash: line 29" in crashed.error and "crash: line 0\n" not in crashed.error


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


def test_cancel_kills_trials_and_their_grandchildren(harness: Harness, tmp_path: Path) -> None:
    pidfiles = [tmp_path / f"pids-{i}" for i in range(2)]
    sweep_id = harness.submit(
        "n=0,1,2",
        command=[sys.executable, str(FIXTURES / "sleeper.py"), str(tmp_path / "pids-{n}")],
        split=2,
    )

    async def scenario() -> list[int]:
        stop = asyncio.Event()
        task = asyncio.create_task(harness.scheduler.run(stop))
        await until(lambda: all(p.exists() for p in pidfiles), "both trials to start")
        pids = [int(pid) for p in pidfiles for pid in p.read_text().split()]
        harness.cancel(sweep_id)
        await until(lambda: harness.sweep_status(sweep_id) == SweepStatus.cancelled, "cancel")
        stop.set()
        await task
        return pids

    pids = asyncio.run(scenario())
    statuses = [t.status for t in harness.trials(sweep_id)]
    assert statuses == [TrialStatus.cancelled] * 3
    assert not (tmp_path / "pids-2").exists(), "the queued trial must never start"
    assert wait_gone(pids) == []


def test_a_trial_that_ignores_sigterm_is_killed_after_the_grace_period(
    harness: Harness, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pids"
    sweep_id = harness.submit(
        command=[sys.executable, str(FIXTURES / "sleeper.py"), str(pidfile), "--ignore-term"]
    )

    async def scenario() -> float:
        stop = asyncio.Event()
        task = asyncio.create_task(harness.scheduler.run(stop))
        await until(pidfile.exists, "the trial to start")
        harness.cancel(sweep_id)
        cancelled_at = time.monotonic()
        await until(lambda: harness.sweep_status(sweep_id) == SweepStatus.cancelled, "cancel")
        stop.set()
        await task
        return time.monotonic() - cancelled_at

    asyncio.run(scenario())
    (trial,) = harness.trials(sweep_id)
    assert trial.status == TrialStatus.cancelled
    assert trial.signal == signal.SIGKILL, "SIGTERM was ignored: only SIGKILL ends it"


def test_a_trial_past_its_time_limit_fails(harness: Harness, tmp_path: Path) -> None:
    sweep_id = harness.submit(
        command=[sys.executable, str(FIXTURES / "sleeper.py"), str(tmp_path / "pids")],
        time_limit_s=0.5,
    )
    asyncio.run(harness.scheduler.run_until_idle())
    (trial,) = harness.trials(sweep_id)
    assert trial.status == TrialStatus.failed
    assert trial.error == "time limit of 0.5 s exceeded; stopped"
    assert trial.signal == signal.SIGTERM


def test_a_graceful_stop_requeues_running_trials_for_the_next_daemon(
    harness: Harness, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pids"
    sweep_id = harness.submit(command=[sys.executable, str(FIXTURES / "sleeper.py"), str(pidfile)])

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(harness.scheduler.run(stop))
        await until(pidfile.exists, "the trial to start")
        stop.set()
        await task
        await harness.scheduler.drain(stop_trials=True)

    asyncio.run(scenario())
    (trial,) = harness.trials(sweep_id)
    assert trial.status == TrialStatus.queued and trial.attempt == 2
    assert trial.error == "attempt 1 stopped by a daemon shutdown; requeued"
    assert wait_gone([int(pid) for pid in pidfile.read_text().split()]) == []


def test_at_start_a_trial_left_running_by_a_dead_daemon_is_killed_and_requeued(
    harness: Harness, tmp_path: Path
) -> None:
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
    )
    sweep_id = harness.submit(command=["true"])
    harness.mark_running(sweep_id, pid=orphan.pid, started=process_start_ticks(orphan.pid))
    harness.scheduler.reconcile()
    assert orphan.wait(timeout=10) == -signal.SIGKILL
    (trial,) = harness.trials(sweep_id)
    assert trial.status == TrialStatus.queued and trial.attempt == 2
    asyncio.run(harness.scheduler.run_until_idle())
    (trial,) = harness.trials(sweep_id)
    assert trial.status == TrialStatus.succeeded and trial.attempt == 2


def test_on_gpus_each_trial_gets_its_gpu_and_a_slice_that_respects_foreign_memory(
    settings: Settings, sessions: Sessions, tmp_path: Path
) -> None:
    nvml = scripted_nvml("foreign_memory")
    harness = Harness(settings, sessions, tmp_path, probe=NvmlProbe(nvml))
    sweep_id = harness.submit(
        "x=1,2", command=[sys.executable, str(FIXTURES / "echo_env.py")], split=2
    )
    asyncio.run(harness.scheduler.run_until_idle())
    first, second = harness.trials(sweep_id)
    usable = [H100_MB - settings.reserve_mb - 30000, H100_MB - settings.reserve_mb]
    for trial, gpu, room in zip((first, second), nvml.gpus, usable, strict=True):
        assert trial.status == TrialStatus.succeeded and trial.device == gpu.uuid
        assert trial.log_path is not None
        env = json.loads(Path(trial.log_path).read_text().splitlines()[-1])["env"]
        assert env["CUDA_VISIBLE_DEVICES"] == gpu.uuid and env["GPUMUX_DEVICE_KIND"] == "gpu"
        cap = room // 2 - settings.overhead_mb
        assert trial.memory_limit_mb == cap and env["GPUMUX_MEMORY_LIMIT_MB"] == str(cap)
        assert env["GPUMUX_DEVICE_MEMORY_MB"] == str(H100_MB)


@pytest.mark.parametrize("pin", [False, True])
def test_a_gpu_trial_gets_threads_for_its_share_of_the_hosts_cores(
    settings: Settings, sessions: Sessions, tmp_path: Path, pin: bool
) -> None:
    nvml = scripted_nvml("two_gpus")
    pinned = settings.model_copy(update={"cpu_affinity": pin})
    harness = Harness(pinned, sessions, tmp_path, probe=NvmlProbe(nvml))
    sweep_id = harness.submit(
        "x=1,2,3,4", command=[sys.executable, str(FIXTURES / "echo_env.py")], split=2
    )
    asyncio.run(harness.scheduler.run_until_idle())
    # The daemon's cores, in one block per GPU; 1/N of its GPU's block for each trial.
    cores = sorted(os.sched_getaffinity(0))
    blocks = dict(zip((gpu.uuid for gpu in nvml.gpus), core_blocks(cores, 2), strict=True))
    for trial in harness.trials(sweep_id):
        assert trial.status == TrialStatus.succeeded and trial.log_path is not None
        assert trial.device is not None and trial.slot is not None
        log = Path(trial.log_path).read_text()
        record = json.loads(log.splitlines()[-1])
        block = blocks[trial.device]
        threads = max(1, len(block) // 2)
        assert trial.cpu_threads == threads
        for name in ("GPUMUX_CPU_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            assert record["env"][name] == str(threads), (name, record)
        assert record["env"]["OPENBLAS_NUM_THREADS"] == str(threads)
        if pin:
            expected = pinned_cores(block, slot=trial.slot, threads=threads)
            assert record["affinity"] == list(expected)
            assert record["env"]["GPUMUX_CPU_CORES"] == ",".join(map(str, expected))
            assert f"gpumux: pinned to cores {','.join(map(str, expected))}" in log
        else:
            assert record["affinity"] == cores and "GPUMUX_CPU_CORES" not in record["env"]


def test_the_overhead_a_running_trial_shows_in_nvml_is_measured(
    settings: Settings, sessions: Sessions, tmp_path: Path
) -> None:
    nvml = scripted_nvml("two_gpus")
    nvml.gpus[0].processes = []
    harness = Harness(settings, sessions, tmp_path, probe=NvmlProbe(nvml))
    pidfile = tmp_path / "pids"
    harness.submit(command=[sys.executable, str(FIXTURES / "sleeper.py"), str(pidfile)], split=1)

    async def scenario() -> dict[str, int]:
        stop = asyncio.Event()
        task = asyncio.create_task(harness.scheduler.run(stop))
        await until(pidfile.exists, "the trial to start")
        leader, worker = (int(pid) for pid in pidfile.read_text().split())
        (trial,) = harness.trials(1)
        assert trial.memory_limit_mb is not None
        nvml.gpus[0].processes = [
            ScriptedProcess(pid=leader, used_mb=trial.memory_limit_mb + 500),
            ScriptedProcess(pid=worker, used_mb=200),
        ]
        await until(
            lambda: any(p.pid == leader for p in harness.scheduler.devices[0].processes or ()),
            "a probe that sees the trial's processes",
        )
        harness.submit(command=["true"])
        await until(lambda: bool(harness.scheduler.overheads.measured()), "a measurement")
        harness.cancel(1)
        await until(lambda: harness.sweep_status(1) == SweepStatus.cancelled, "cancel")
        stop.set()
        await task
        return harness.scheduler.overheads.measured()

    assert asyncio.run(scenario()) == {nvml.gpus[0].uuid: 700}


def test_a_trial_that_ended_since_the_last_probe_does_not_shrink_the_next_slice(
    settings: Settings, sessions: Sessions, tmp_path: Path
) -> None:
    # Probes far apart, so that the next trial is placed on the snapshot that still lists the
    # one that just ended (a real daemon probes every poll interval, and an exit wakes it now).
    slow = settings.model_copy(update={"poll_interval": 5.0})
    gpu = ScriptedGpu(
        name=H100_NAME, uuid="GPU-ended-since-probe", total_mb=H100_MB, used_mb=0, utilization_pct=0
    )
    nvml = ScriptedNvml([gpu])
    harness = Harness(slow, sessions, tmp_path, probe=NvmlProbe(nvml))
    flag = tmp_path / "release"
    sweep_id = harness.submit(
        "x=1,2", command=[sys.executable, str(FIXTURES / "wait_for_file.py"), str(flag)], split=1
    )

    def running() -> Trial | None:
        return next((t for t in harness.trials(sweep_id) if t.status == TrialStatus.running), None)

    async def scenario() -> int:
        stop = asyncio.Event()
        task = asyncio.create_task(harness.scheduler.run(stop))
        await until(lambda: (t := running()) is not None and t.pid is not None, "a trial to run")
        first = running()
        assert first is not None and first.pid is not None
        gpu.processes = [ScriptedProcess(pid=first.pid, used_mb=20000)]
        gpu.used_mb = 20000
        await until(
            lambda: any(p.pid == first.pid for p in harness.scheduler.devices[0].processes or ()),
            "a probe that sees the first trial's process",
        )
        # From here NVML no longer lists it, as once it ends; the cached snapshot still does.
        gpu.processes, gpu.used_mb = [], 0
        flag.touch()
        await until(lambda: harness.sweep_status(sweep_id) == SweepStatus.finished, "the sweep")
        stop.set()
        await task
        return first.id

    first_id = asyncio.run(scenario())
    (first,) = (t for t in harness.trials(sweep_id) if t.id == first_id)
    (second,) = (t for t in harness.trials(sweep_id) if t.id != first_id)
    assert first.status == second.status == TrialStatus.succeeded
    # Alone on the device, each trial gets the same slice: the first's process, listed in the
    # snapshot the second was placed on, is ours, not another user's 20,000 MiB.
    assert first.memory_limit_mb is not None
    assert second.memory_limit_mb == first.memory_limit_mb


class EndsAfterTheProbe:
    """NVML's snapshot, after which one process it lists is killed and gone from /proc before
    the tick scans it: a process that ends between the probe and the scan."""

    def __init__(self, nvml: ScriptedNvml) -> None:
        self.nvml = NvmlProbe(nvml)
        self.doomed: int | None = None

    def snapshot(self) -> list[DeviceSnapshot]:
        devices = self.nvml.snapshot()
        if self.doomed is not None:
            os.kill(self.doomed, signal.SIGKILL)
            deadline = time.monotonic() + DEADLINE
            # Gone, not a zombie: the trial reaps its worker.
            while Path(f"/proc/{self.doomed}").exists():
                assert time.monotonic() < deadline, "the worker to be reaped"
                time.sleep(0.01)
            self.doomed = None
        return devices

    def close(self) -> None:
        self.nvml.close()


async def ticks_until(scheduler: Scheduler, condition: Callable[[], bool], what: str) -> None:
    """Tick the scheduler, one tick at a time, until a condition holds, with a deadline."""
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await scheduler.tick()
        await asyncio.sleep(0.02)


def idle_gpu(uuid: str) -> ScriptedGpu:
    return ScriptedGpu(name=H100_NAME, uuid=uuid, total_mb=H100_MB, used_mb=0, utilization_pct=0)


def test_a_worker_that_ended_between_the_probe_and_the_scan_does_not_shrink_the_next_slice(
    settings: Settings, sessions: Sessions, tmp_path: Path
) -> None:
    # A probe at every tick: each tick places trials on a snapshot taken before its own scan.
    eager = settings.model_copy(update={"poll_interval": 1e-9})
    gpu = idle_gpu("GPU-worker-ended")
    probe = EndsAfterTheProbe(ScriptedNvml([gpu]))
    harness = Harness(eager, sessions, tmp_path, probe=probe)
    pidfile = tmp_path / "pids"
    first_sweep = harness.submit(
        command=[sys.executable, str(FIXTURES / "reaped_worker.py"), str(pidfile)], split=2
    )

    async def scenario() -> tuple[Trial, Trial]:
        scheduler = harness.scheduler
        await ticks_until(
            scheduler,
            lambda: pidfile.exists() and harness.trials(first_sweep)[0].pid is not None,
            "the first trial to run",
        )
        worker = int(pidfile.read_text().split()[1])
        # Its worker (not its group's leader) holds device memory; a tick's scan sees it ours.
        gpu.processes, gpu.used_mb = [ScriptedProcess(pid=worker, used_mb=4000)], 4000
        await scheduler.tick()
        second_sweep = harness.submit(command=["true"], split=2)
        # The next probe still lists the worker; it ends before that tick's scan.
        probe.doomed = worker
        await scheduler.tick()
        (first,) = harness.trials(first_sweep)
        (second,) = harness.trials(second_sweep)
        gpu.processes, gpu.used_mb = [], 0
        harness.cancel(first_sweep)
        await scheduler.run_until_idle()
        return first, second

    first, second = asyncio.run(scenario())
    # Alone on the device but for the first trial, the second gets the same half: the worker
    # that ended is the first trial's, not another user's 4,000 MiB.
    assert first.memory_limit_mb is not None
    assert second.status is not TrialStatus.queued
    assert second.memory_limit_mb == first.memory_limit_mb


def test_a_trial_reaped_in_the_tick_that_probes_does_not_shrink_the_next_slice(
    settings: Settings, sessions: Sessions, tmp_path: Path
) -> None:
    # A probe at every tick: the tick that reaps the first trial probes, and the snapshot still
    # lists the first trial's process (NVML lists a process a moment after it ends).
    eager = settings.model_copy(update={"poll_interval": 1e-9})
    gpu = idle_gpu("GPU-reaped-then-probed")
    harness = Harness(eager, sessions, tmp_path, probe=NvmlProbe(ScriptedNvml([gpu])))
    flag = tmp_path / "release"
    sweep_id = harness.submit(
        "x=1,2", command=[sys.executable, str(FIXTURES / "wait_for_file.py"), str(flag)], split=1
    )

    def running() -> Trial | None:
        return next((t for t in harness.trials(sweep_id) if t.status == TrialStatus.running), None)

    async def scenario() -> tuple[Trial, Trial]:
        scheduler = harness.scheduler
        await ticks_until(
            scheduler, lambda: (t := running()) is not None and t.pid is not None, "a trial to run"
        )
        first = running()
        assert first is not None and first.pid is not None
        gpu.processes, gpu.used_mb = [ScriptedProcess(pid=first.pid, used_mb=20000)], 20000
        await scheduler.tick()
        flag.touch()
        assert wait_gone([supervisor_pid(harness.scheduler.settings, first)]) == []
        # This tick reaps the first trial, then probes: the snapshot still lists its process.
        await scheduler.tick()
        (second,) = (t for t in harness.trials(sweep_id) if t.id != first.id)
        gpu.processes, gpu.used_mb = [], 0
        await scheduler.run_until_idle()
        return first, second

    first, second = asyncio.run(scenario())
    assert first.memory_limit_mb is not None
    assert second.status is not TrialStatus.queued
    assert second.memory_limit_mb == first.memory_limit_mb
    assert {t.status for t in harness.trials(sweep_id)} == {TrialStatus.succeeded}


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


def test_at_start_the_children_of_a_dead_trial_leader_are_killed(
    harness: Harness, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pids"
    leader = subprocess.Popen(
        [sys.executable, str(FIXTURES / "sleeper.py"), str(pidfile)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
    )
    wait_for_file(pidfile, "the sleeper did not start")
    child = int(pidfile.read_text().split()[1])
    started = process_start_ticks(leader.pid)
    leader.kill()
    leader.wait()
    assert not gone(child), "the child must outlive its leader for this test"
    sweep_id = harness.submit(command=["true"])
    harness.mark_running(sweep_id, pid=leader.pid, started=started)
    harness.scheduler.reconcile()
    assert wait_gone([child]) == []
    (trial,) = harness.trials(sweep_id)
    assert trial.status == TrialStatus.queued and trial.log_path is None


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


def exit_after_flag(flag: Path, code: int) -> list[str]:
    """A trial that waits for `flag` to exist, then exits with `code`."""
    script = (
        "import pathlib, sys, time\n"
        f"flag = pathlib.Path({str(flag)!r})\n"
        "while not flag.exists(): time.sleep(0.02)\n"
        f"sys.exit({code})\n"
    )
    return [sys.executable, "-c", script]


async def start_then_leave(harness: Harness, sweep_id: int) -> None:
    """Run the scheduler until the sweep's trials run, then stop it gracefully, leaving them."""
    stop = asyncio.Event()
    task = asyncio.create_task(harness.scheduler.run(stop))
    await until(
        lambda: all(t.pid is not None for t in harness.trials(sweep_id)), "the trials to start"
    )
    stop.set()
    await task
    await harness.scheduler.drain(stop_trials=False)


def test_a_graceful_stop_leaves_trials_running_and_the_next_scheduler_adopts_them(
    settings: Settings, sessions: Sessions, tmp_path: Path
) -> None:
    flag = tmp_path / "flag"
    first = Harness(settings, sessions, tmp_path)
    sweep_id = first.submit("x=1,2", command=exit_after_flag(flag, 5), split=2)
    asyncio.run(start_then_leave(first, sweep_id))
    leaders = [t.pid for t in first.trials(sweep_id)]
    assert all(t.status == TrialStatus.running for t in first.trials(sweep_id))
    assert all(pid is not None and not gone(pid) for pid in leaders), "they run on"

    second = Harness(settings, sessions, tmp_path)

    async def adopt_then_release() -> None:
        second.scheduler.reconcile()
        assert second.scheduler.running_count == 2, "both adopted, none requeued"
        flag.touch()
        await second.scheduler.run_until_idle()

    asyncio.run(adopt_then_release())
    trials = second.trials(sweep_id)
    assert [(t.status, t.exit_code, t.attempt) for t in trials] == [
        (TrialStatus.failed, 5, 1),
        (TrialStatus.failed, 5, 1),
    ]


def test_a_trial_that_ends_while_no_daemon_runs_is_recorded_with_its_exit_status(
    settings: Settings, sessions: Sessions, tmp_path: Path
) -> None:
    flag = tmp_path / "flag"
    first = Harness(settings, sessions, tmp_path)
    sweep_id = first.submit(command=exit_after_flag(flag, 0))
    asyncio.run(start_then_leave(first, sweep_id))
    (trial,) = first.trials(sweep_id)
    run_dir = settings.layout.runs / f"{trial.id}.1"
    flag.touch()
    wait_for_file(run_dir / "exit.json", "the supervisor never recorded the exit")

    second = Harness(settings, sessions, tmp_path)
    second.scheduler.reconcile()
    (trial,) = second.trials(sweep_id)
    assert (trial.status, trial.exit_code, trial.attempt) == (TrialStatus.succeeded, 0, 1)


def test_a_supervisor_killed_with_its_daemon_away_leaves_a_lost_trial_that_is_requeued(
    settings: Settings, sessions: Sessions, tmp_path: Path
) -> None:
    first = Harness(settings, sessions, tmp_path)
    pidfile = tmp_path / "pids"
    sweep_id = first.submit(command=[sys.executable, str(FIXTURES / "sleeper.py"), str(pidfile)])
    asyncio.run(start_then_leave(first, sweep_id))
    # Running means its command started; the sleeper records its pids a moment later.
    wait_for_file(pidfile, "the sleeper's pids")
    (trial,) = first.trials(sweep_id)
    supervisor = supervisor_pid(settings, trial)
    os.kill(supervisor, signal.SIGKILL)
    assert wait_gone([supervisor]) == []

    second = Harness(settings, sessions, tmp_path)
    second.scheduler.reconcile()
    assert wait_gone([int(pid) for pid in pidfile.read_text().split()]) == [], "no orphans"
    (trial,) = second.trials(sweep_id)
    assert (trial.status, trial.attempt) == (TrialStatus.queued, 2)
    assert trial.error == "attempt 1 lost its supervisor while the daemon was away; requeued"


def test_a_supervisor_whose_heartbeat_goes_stale_is_killed_and_its_trial_requeued(
    settings: Settings, sessions: Sessions, tmp_path: Path
) -> None:
    settings.heartbeat_interval = 0.1
    settings.heartbeat_timeout = 3.0
    harness = Harness(settings, sessions, tmp_path)
    pidfile = tmp_path / "pids"
    sweep_id = harness.submit(command=[sys.executable, str(FIXTURES / "sleeper.py"), str(pidfile)])

    async def scenario() -> tuple[list[int], str | None]:
        stop = asyncio.Event()
        task = asyncio.create_task(harness.scheduler.run(stop))
        await until(pidfile.exists, "the trial to start")
        first_pids = [int(pid) for pid in pidfile.read_text().split()]
        await until(
            lambda: harness.trials(sweep_id)[0].status is TrialStatus.running, "it to be running"
        )
        (trial,) = harness.trials(sweep_id)
        os.kill(supervisor_pid(settings, trial), signal.SIGSTOP)  # hung: alive, silent
        await until(lambda: harness.trials(sweep_id)[0].attempt == 2, "the trial to be requeued")
        error = harness.trials(sweep_id)[0].error
        stop.set()
        await task
        await harness.scheduler.drain(stop_trials=True)
        return first_pids, error

    first_pids, error = asyncio.run(scenario())
    assert wait_gone(first_pids) == [], "no orphans"
    assert error == "attempt 1 lost its supervisor (killed, or stopped answering); requeued"


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


def test_the_end_of_an_older_attempt_never_overwrites_the_newer_one(
    settings: Settings, sessions: Sessions, tmp_path: Path
) -> None:
    flag = tmp_path / "flag"
    first = Harness(settings, sessions, tmp_path)
    script = (
        "import os, pathlib, sys, time\n"
        f"flag = pathlib.Path({str(flag)!r})\n"
        "while not flag.exists(): time.sleep(0.02)\n"
        "sys.exit(10 + int(os.environ['GPUMUX_ATTEMPT']))\n"
    )
    sweep_id = first.submit(command=[sys.executable, "-c", script])
    asyncio.run(start_then_leave(first, sweep_id))
    with sessions.write.begin() as session:
        (trial,) = trial_store.list_trials(session=session, sweep_id=sweep_id)[0]
        lifecycle.set_trial_status(
            session=session, trial=trial, status=TrialStatus.queued, attempt=2, pid=None
        )
    flag.touch()
    run_dir = settings.layout.runs / "1.1"
    wait_for_file(run_dir / "exit.json", "attempt 1 never ended")

    second = Harness(settings, sessions, tmp_path)
    asyncio.run(second.scheduler.run_until_idle())
    (trial,) = second.trials(sweep_id)
    assert (trial.status, trial.attempt, trial.exit_code) == (TrialStatus.failed, 2, 12)
    assert json.loads((run_dir / "exit.json").read_text())["exit_code"] == 11


def test_why_gpumux_stopped_a_trial_outlives_the_daemon_that_stopped_it(
    settings: Settings, sessions: Sessions, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pids"
    first = Harness(settings, sessions, tmp_path)
    # Deaf to SIGTERM: it outlives the grace period, in which this daemon goes away.
    sleeper = [sys.executable, str(FIXTURES / "sleeper.py"), str(pidfile), "--ignore-term"]
    sweep_id = first.submit(command=sleeper, time_limit_s=1.0)

    async def stop_then_leave() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(first.scheduler.run(stop))
        await until(
            lambda: any(e.stop is not None for _, e in first.scheduler.watched.items()),
            "the time limit to stop the trial",
        )
        stop.set()
        await task
        await first.scheduler.drain(stop_trials=False)

    asyncio.run(stop_then_leave())
    run_dir = settings.layout.runs / "1.1"
    wait_for_file(run_dir / "exit.json", "the supervisor did not kill the trial")

    second = Harness(settings, sessions, tmp_path)
    second.scheduler.reconcile()
    (trial,) = second.trials(sweep_id)
    assert (trial.status, trial.signal) == (TrialStatus.failed, signal.SIGKILL)
    assert trial.error == "time limit of 1 s exceeded; stopped"


def test_a_trial_its_supervisor_stopped_for_a_lapsed_lease_is_requeued_not_failed(
    harness: Harness, settings: Settings, tmp_path: Path
) -> None:
    # The node's renewals came late (a loaded machine): its supervisors stopped the trial as
    # the lease ran out, while the database still held it for this node.
    pidfile = tmp_path / "pids"
    sweep_id = harness.submit(
        command=[sys.executable, str(FIXTURES / "sleeper.py"), str(pidfile)], split=1
    )

    async def scenario() -> Trial:
        stop = asyncio.Event()
        task = asyncio.create_task(harness.scheduler.run(stop))
        await until(pidfile.exists, "the trial to start")
        (first,) = harness.trials(sweep_id)
        run_dir = settings.layout.runs / f"{first.id}.{first.attempt}"
        # What the supervisor's fence does: record why, then kill the group at once.
        (run_dir / rundir.STOP_REASON).write_text(rundir.LEASE_LAPSED)
        os.killpg(int(pidfile.read_text().split()[0]), signal.SIGKILL)
        await until(lambda: harness.trials(sweep_id)[0].attempt == 2, "the trial's requeue")
        harness.cancel(sweep_id)
        await until(lambda: harness.sweep_status(sweep_id) == SweepStatus.cancelled, "cancel")
        stop.set()
        await task
        return harness.trials(sweep_id)[0]

    trial = asyncio.run(scenario())
    assert trial.attempt == 2 and trial.failures == 0
    assert trial.status is TrialStatus.cancelled


def test_the_report_budget_holds_no_allowance_of_an_ended_trial(harness: Harness) -> None:
    work = (
        "import json\n"
        "for step in range(3):\n"
        "    print('GPUMUX_REPORT', json.dumps({'step': step, 'loss': 1 / (step + 1)}), flush=True)"
    )
    sweep_id = harness.submit("x=1..4", command=[sys.executable, "-c", work], split=2)
    asyncio.run(harness.scheduler.run_until_idle())
    trials = harness.trials(sweep_id)
    assert {t.status for t in trials} == {TrialStatus.succeeded}
    with harness.sessions.read() as session:
        counts = [report_store.list_reports(session=session, trial_id=t.id)[1] for t in trials]
    assert counts == [3] * len(trials)
    assert len(harness.scheduler.budget) == 0
