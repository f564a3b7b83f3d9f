"""A simulated device's shared state, and a simulated trial on it without a daemon."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpumux.devices.simulated.model import model_from
from gpumux.devices.simulated.nvml import SimulatedNvml
from gpumux.devices.simulated.state import (
    COMPUTING,
    STARTING,
    Device,
    Entry,
    census,
    read_device,
    write_device,
)

MODEL = model_from(
    {
        "name": "Test GPU",
        "memory_mb": 10_000,
        "cores": 4,
        "per_process_mb": 1_000,
        "startup_s": 0.0,
        "throughput": {"1": 100},
    },
    source="test",
)


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_census_counts_live_entries_by_phase_and_forgets_the_dead(tmp_path: Path) -> None:
    directory = str(tmp_path)
    write_device(directory, Device(model=MODEL, time_scale=0.5))
    assert read_device(directory) == Device(model=MODEL, time_scale=0.5)
    mine = Entry(directory, os.getpid())
    mine.enter(STARTING, 0)
    dead = dead_pid()
    Entry(directory, dead).enter(COMPUTING, 700)
    assert census(directory).active == 1
    assert census(directory).memory == ((os.getpid(), 0),)
    mine.move(COMPUTING, 900)
    assert (census(directory).starting, census(directory).computing) == (0, 1)
    assert f"{dead}-{COMPUTING}-700" in os.listdir(directory)
    census(directory, remove_dead=True)
    assert f"{dead}-{COMPUTING}-700" not in os.listdir(directory)
    mine.leave()
    assert census(directory).memory == ()


def test_nvml_shows_each_computing_process_and_its_memory(tmp_path: Path) -> None:
    directory = str(tmp_path)
    device = Device(model=MODEL, time_scale=1.0)
    write_device(directory, device)
    nvml = SimulatedNvml(device, uuid="GPU-test", directory=directory)
    nvml.nvmlInit()
    Entry(directory, os.getpid()).enter(COMPUTING, 900)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    (process,) = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert (process.pid, process.usedGpuMemory) == (os.getpid(), 900 * 2**20)
    assert nvml.nvmlDeviceGetMemoryInfo(handle).used == 900 * 2**20
    assert nvml.nvmlDeviceGetUtilizationRates(handle).gpu == 100
    assert nvml.nvmlDeviceGetName(handle) == "Test GPU (simulated)"


def test_a_trial_stopped_by_sigterm_leaves_the_device_and_dies_of_the_signal(
    tmp_path: Path,
) -> None:
    directory = str(tmp_path)
    write_device(directory, Device(model=MODEL, time_scale=1.0))
    trial = subprocess.Popen(
        [sys.executable, "-m", "gpumux.devices.simulated.trial", "--samples=1e9"]
        + [f"--state={directory}"],
    )
    deadline = time.monotonic() + 30
    while census(directory).computing != 1:
        assert time.monotonic() < deadline, "the trial never computed"
        time.sleep(0.05)
    trial.send_signal(signal.SIGTERM)
    assert trial.wait(timeout=30) == -signal.SIGTERM
    assert [name for name in os.listdir(directory) if name != "device.json"] == []
