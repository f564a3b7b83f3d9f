"""Probing the devices: each trial its GPU, its memory slice and its threads; what NVML shows of
running trials, and trials that end around a probe."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
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
from gpumux.devices.probes import NvmlProbe
from gpumux.devices.snapshot import DeviceSnapshot, core_blocks
from gpumux.scheduling.loop import Scheduler
from gpumux.status import SweepStatus, TrialStatus
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Trial

from .support import (
    DEADLINE,
    FIXTURES,
    Harness,
    supervisor_pid,
    until,
    wait_gone,
)


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


@dataclass(frozen=True)
class InTurn:
    """A sweep of two trials at N=1 on one idle scripted GPU, each running until `flag` exists."""

    harness: Harness
    gpu: ScriptedGpu
    sweep_id: int
    flag: Path

    def started(self) -> Trial | None:
        """The trial running now with its process started, if one is."""
        trials = self.harness.trials(self.sweep_id)
        return next((t for t in trials if t.status == TrialStatus.running and t.pid), None)


def in_turn(
    settings: Settings, sessions: Sessions, tmp_path: Path, *, uuid: str, poll_interval: float
) -> InTurn:
    """Two trials in turn on the GPU `uuid`, probed every `poll_interval`."""
    gpu = idle_gpu(uuid)
    probing = settings.model_copy(update={"poll_interval": poll_interval})
    harness = Harness(probing, sessions, tmp_path, probe=NvmlProbe(ScriptedNvml([gpu])))
    flag = tmp_path / "release"
    sweep_id = harness.submit(
        "x=1,2", command=[sys.executable, str(FIXTURES / "wait_for_file.py"), str(flag)], split=1
    )
    return InTurn(harness, gpu, sweep_id, flag)


def assert_same_slice(first: Trial, second: Trial) -> None:
    """The second trial, placed while the first's process was still listed, got the first's
    slice: that process is ours, not another user's memory."""
    assert first.memory_limit_mb is not None
    assert second.status is not TrialStatus.queued
    assert second.memory_limit_mb == first.memory_limit_mb


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
    turn = in_turn(settings, sessions, tmp_path, uuid="GPU-ended-since-probe", poll_interval=5.0)
    harness, gpu = turn.harness, turn.gpu

    async def scenario() -> int:
        stop = asyncio.Event()
        task = asyncio.create_task(harness.scheduler.run(stop))
        await until(lambda: turn.started() is not None, "a trial to run")
        first = turn.started()
        assert first is not None and first.pid is not None
        gpu.processes = [ScriptedProcess(pid=first.pid, used_mb=20000)]
        gpu.used_mb = 20000
        await until(
            lambda: any(p.pid == first.pid for p in harness.scheduler.devices[0].processes or ()),
            "a probe that sees the first trial's process",
        )
        # From here NVML no longer lists it, as once it ends; the cached snapshot still does.
        gpu.processes, gpu.used_mb = [], 0
        turn.flag.touch()
        await until(
            lambda: harness.sweep_status(turn.sweep_id) == SweepStatus.finished, "the sweep"
        )
        stop.set()
        await task
        return first.id

    first_id = asyncio.run(scenario())
    (first,) = (t for t in harness.trials(turn.sweep_id) if t.id == first_id)
    (second,) = (t for t in harness.trials(turn.sweep_id) if t.id != first_id)
    assert first.status == second.status == TrialStatus.succeeded
    # Alone on the device, each trial gets the same slice: the first's process was listed in
    # the snapshot the second was placed on (20,000 MiB).
    assert_same_slice(first, second)


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
    # that ended is the first trial's (4,000 MiB).
    assert_same_slice(first, second)


def test_a_trial_reaped_in_the_tick_that_probes_does_not_shrink_the_next_slice(
    settings: Settings, sessions: Sessions, tmp_path: Path
) -> None:
    # A probe at every tick: the tick that reaps the first trial probes, and the snapshot still
    # lists the first trial's process (NVML lists a process a moment after it ends).
    turn = in_turn(settings, sessions, tmp_path, uuid="GPU-reaped-then-probed", poll_interval=1e-9)
    harness, gpu = turn.harness, turn.gpu

    async def scenario() -> tuple[Trial, Trial]:
        scheduler = harness.scheduler
        await ticks_until(scheduler, lambda: turn.started() is not None, "a trial to run")
        first = turn.started()
        assert first is not None and first.pid is not None
        gpu.processes, gpu.used_mb = [ScriptedProcess(pid=first.pid, used_mb=20000)], 20000
        await scheduler.tick()
        turn.flag.touch()
        assert wait_gone([supervisor_pid(harness.scheduler.settings, first)]) == []
        # This tick reaps the first trial, then probes: the snapshot still lists its process.
        await scheduler.tick()
        (second,) = (t for t in harness.trials(turn.sweep_id) if t.id != first.id)
        gpu.processes, gpu.used_mb = [], 0
        await scheduler.run_until_idle()
        return first, second

    first, second = asyncio.run(scenario())
    assert_same_slice(first, second)
    assert {t.status for t in harness.trials(turn.sweep_id)} == {TrialStatus.succeeded}
