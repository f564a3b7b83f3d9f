from __future__ import annotations

import logging
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest
from scripted_nvml import (
    FOREIGN_PID,
    H100_MB,
    H100_NAME,
    ScriptedProcess,
    scripted_nvml,
)

from gpumux.devices.probes import CpuProbe, NvmlProbe, NvmlUnavailable, make_probe
from gpumux.devices.snapshot import GpuProcess

# Where scripted_nvml.py is, for a child Python to import it.
TESTS = Path(__file__).resolve().parent.parent
UNAVAILABLE_LINE = "devices: NVML unavailable (%s); offering the CPU as one device"


def _real_nvml_error() -> str | None:
    """The real NVML's start-up error on this host, None when it starts."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return str(exc)
    pynvml.nvmlShutdown()
    return None


@pytest.fixture
def nvml_error() -> str:
    error = _real_nvml_error()
    if error is None:
        pytest.skip("NVML starts on this host: the no-GPU path cannot be exercised for real")
    return error


@pytest.fixture
def real_nvml() -> None:
    if _real_nvml_error() is not None:
        pytest.skip("no NVML on this host")


@pytest.fixture
def devices_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.WARNING, logger="gpumux.devices.probes"):
        yield caplog


def test_real_nvml_probe_raises_the_nvml_error_text(nvml_error: str) -> None:
    # No library here; a host with the library and no driver says "Driver Not Loaded".
    with pytest.raises(NvmlUnavailable) as raised:
        NvmlProbe().snapshot()
    assert str(raised.value) == nvml_error
    assert isinstance(raised.value.__cause__, pynvml.NVMLError)


def test_real_make_probe_falls_back_to_cpu_and_logs_once(
    nvml_error: str, devices_log: pytest.LogCaptureFixture
) -> None:
    probe = make_probe()
    assert isinstance(probe, CpuProbe)
    probe.snapshot()
    probe.snapshot()
    probe.close()
    assert [(r.levelno, r.getMessage()) for r in devices_log.records] == [
        (logging.WARNING, UNAVAILABLE_LINE % nvml_error)
    ]


def test_real_nvml_lists_real_gpus(real_nvml: None) -> None:
    probe = make_probe()
    assert isinstance(probe, NvmlProbe)
    gpus = probe.snapshot()
    probe.close()
    assert gpus
    for gpu in gpus:
        assert gpu.error is None
        assert gpu.uuid is not None and gpu.key == gpu.uuid and gpu.uuid.startswith("GPU-")
        assert gpu.memory_total_mb is not None and gpu.memory_total_mb > 0
        assert gpu.processes is not None


def test_two_gpus_fields() -> None:
    nvml = scripted_nvml("two_gpus")
    first, second = NvmlProbe(nvml).snapshot()
    assert first.key == first.uuid == nvml.gpus[0].uuid
    assert first.uuid is not None and first.uuid.startswith("GPU-")
    assert (first.kind, first.index, first.name) == ("gpu", 0, H100_NAME)
    assert (first.memory_total_mb, first.memory_used_mb, first.memory_free_mb) == (
        H100_MB,
        4618,
        H100_MB - 4618,
    )
    assert first.utilization_pct == 37
    assert first.processes == (GpuProcess(pid=31001, used_memory_mb=4096),)
    assert first.error is None
    assert second.key == nvml.gpus[1].uuid != first.key
    assert (second.index, second.memory_used_mb, second.processes) == (1, 522, ())
    # Each GPU's trials share half of the cores this process may use (all when it has one).
    cores = sorted(os.sched_getaffinity(0))
    half = len(cores) // 2
    blocks = (cores[:half], cores[half : 2 * half]) if half else (cores, cores)
    assert [list(gpu.cpu_cores or ()) for gpu in (first, second)] == list(blocks)
    assert [gpu.cpu_count for gpu in (first, second)] == [len(block) for block in blocks]


@pytest.mark.parametrize(
    ("cores", "gpus", "blocks"),
    [
        (range(16), 1, [tuple(range(16))]),
        (range(16), 2, [tuple(range(8)), tuple(range(8, 16))]),
        # A core left over stays unused: no GPU's trials get more than another's.
        (range(16), 3, [(0, 1, 2, 3, 4), (5, 6, 7, 8, 9), (10, 11, 12, 13, 14)]),
        ((9, 3, 5, 7), 2, [(3, 5), (7, 9)]),
        # Fewer cores than GPUs: every GPU's trials share them all.
        ((4,), 2, [(4,), (4,)]),
    ],
)
def test_each_gpu_gets_an_equal_block_of_the_hosts_cores(
    cores: range | tuple[int, ...], gpus: int, blocks: list[tuple[int, ...]]
) -> None:
    nvml = scripted_nvml("two_gpus")
    nvml.gpus[:] = [*nvml.gpus, *nvml.gpus][:gpus]
    snapshots = NvmlProbe(nvml, cores=list(cores)).snapshot()
    assert [(gpu.cpu_cores, gpu.cpu_count) for gpu in snapshots] == [
        (block, len(block)) for block in blocks
    ]


def test_nvml_starts_lazily_once_and_shuts_down_once() -> None:
    nvml = scripted_nvml("two_gpus")
    probe = NvmlProbe(nvml)
    assert nvml.init_calls == 0
    probe.snapshot()
    probe.snapshot()
    assert nvml.init_calls == 1
    probe.close()
    probe.close()
    assert nvml.shutdown_calls == 1 and not nvml.initialised


def test_nvml_is_shut_down_at_exit() -> None:
    script = (
        "import atexit\n"
        "from gpumux.devices.probes import NvmlProbe\n"
        "from scripted_nvml import scripted_nvml\n"
        "nvml = scripted_nvml('two_gpus')\n"
        "atexit.register(lambda: print('shutdowns', nvml.shutdown_calls))\n"
        "NvmlProbe(nvml).snapshot()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=TESTS, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "shutdowns 1"


def test_one_failing_field_becomes_none() -> None:
    first, second = NvmlProbe(scripted_nvml("one_failing_field")).snapshot()
    assert first.utilization_pct is None
    assert first.memory_total_mb == H100_MB and first.name == H100_NAME
    assert first.processes == (GpuProcess(pid=31001, used_memory_mb=4096),)
    assert second.utilization_pct == 0


@pytest.mark.parametrize("failing", ["name", "uuid", "memory", "processes"])
def test_each_field_fails_alone(failing: str) -> None:
    nvml = scripted_nvml("two_gpus")
    nvml.gpus[0].failing = {failing}
    gpu = NvmlProbe(nvml).snapshot()[0]
    read = {
        "name": gpu.name != "unknown GPU",
        "uuid": gpu.uuid is not None and gpu.key == gpu.uuid,
        "memory": None not in (gpu.memory_total_mb, gpu.memory_used_mb, gpu.memory_free_mb),
        "processes": gpu.processes is not None,
    }
    assert read == {field: field != failing for field in read}
    assert gpu.utilization_pct == 37 and gpu.error is None
    if failing == "uuid":
        assert gpu.key == "gpu:0"


def test_one_failing_gpu_is_listed_with_its_error() -> None:
    first, second = NvmlProbe(scripted_nvml("one_failing")).snapshot()
    assert second.error == "GPU is lost"
    assert (second.key, second.index, second.memory_total_mb) == ("gpu:1", 1, None)
    assert first.error is None and first.memory_total_mb == H100_MB
    assert first.utilization_pct == 37


def test_foreign_process_and_changing_memory_are_visible() -> None:
    nvml = scripted_nvml("foreign_memory")
    probe = NvmlProbe(nvml)
    gpu = probe.snapshot()[0]
    assert gpu.processes == (GpuProcess(pid=FOREIGN_PID, used_memory_mb=30000),)
    assert gpu.memory_used_mb == 30522
    nvml.gpus[0].used_mb = 50522
    nvml.gpus[0].processes.append(ScriptedProcess(pid=5, used_mb=None))
    gpu = probe.snapshot()[0]
    assert (gpu.memory_used_mb, gpu.memory_free_mb) == (50522, H100_MB - 50522)
    assert gpu.processes == (
        GpuProcess(pid=FOREIGN_PID, used_memory_mb=30000),
        GpuProcess(pid=5, used_memory_mb=None),
    )


def test_old_driver_uses_v2_processes_and_bytes_names() -> None:
    nvml = scripted_nvml("old_driver")
    first = NvmlProbe(nvml).snapshot()[0]
    assert first.name == H100_NAME and first.key == nvml.gpus[0].uuid
    assert first.processes == (GpuProcess(pid=31001, used_memory_mb=4096),)


@pytest.mark.parametrize(
    ("scenario", "text"),
    [("no_driver", "Driver Not Loaded"), ("no_library", "NVML Shared Library Not Found")],
)
def test_no_driver_falls_back_to_cpu(
    scenario: str, text: str, devices_log: pytest.LogCaptureFixture
) -> None:
    nvml = scripted_nvml(scenario)
    with pytest.raises(NvmlUnavailable, match=f"^{text}$"):
        NvmlProbe(nvml).snapshot()
    probe = make_probe(nvml=nvml)
    assert isinstance(probe, CpuProbe)
    assert [r.getMessage() for r in devices_log.records] == [UNAVAILABLE_LINE % text]


def test_no_gpus_falls_back_to_cpu_and_releases_nvml(
    devices_log: pytest.LogCaptureFixture,
) -> None:
    nvml = scripted_nvml("no_gpus")
    assert isinstance(make_probe(nvml=nvml), CpuProbe)
    assert nvml.shutdown_calls == 1
    assert [r.getMessage() for r in devices_log.records] == [
        "devices: NVML started but reports no GPU; offering the CPU as one device"
    ]


def test_make_probe_keeps_nvml_with_gpus(devices_log: pytest.LogCaptureFixture) -> None:
    nvml = scripted_nvml("two_gpus")
    probe = make_probe(nvml=nvml)
    assert isinstance(probe, NvmlProbe)
    assert [g.index for g in probe.snapshot()] == [0, 1]
    assert devices_log.records == []
    probe.close()


def test_cpu_probe_on_this_host() -> None:
    probe = CpuProbe()
    first = probe.snapshot()
    assert len(first) == 1
    cpu = first[0]
    assert (cpu.key, cpu.kind, cpu.index, cpu.uuid, cpu.error) == ("cpu", "cpu", 0, None, None)
    assert cpu.name
    assert cpu.memory_total_mb is not None and cpu.memory_total_mb > 0
    assert cpu.memory_free_mb is not None and 0 <= cpu.memory_free_mb <= cpu.memory_total_mb
    assert cpu.cpu_count is not None and cpu.cpu_count >= 1
    assert cpu.utilization_pct is None
    # Poll until the kernel's tick counters move (every few ms): a deadline, not a sleep.
    deadline = time.monotonic() + 10
    utilization = None
    while utilization is None and time.monotonic() < deadline:
        utilization = probe.snapshot()[0].utilization_pct
    assert utilization is not None and 0 <= utilization <= 100


def _fake_proc(root: Path, busy: int, idle: int) -> None:
    (root / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")


def test_cpu_probe_reads_proc(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text(
        "MemTotal:       16384000 kB\nMemFree:         1024000 kB\n"
        "MemAvailable:    4096000 kB\nHugePages_Total:       0\n"
    )
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nmodel name\t: Test CPU @ 2.00GHz\n")
    _fake_proc(tmp_path, busy=1000, idle=9000)
    probe = CpuProbe(proc=tmp_path)
    cpu = probe.snapshot()[0]
    assert cpu.name == "Test CPU @ 2.00GHz"
    assert (cpu.memory_total_mb, cpu.memory_used_mb, cpu.memory_free_mb) == (16000, 12000, 4000)
    assert cpu.utilization_pct is None
    _fake_proc(tmp_path, busy=1030, idle=9070)
    assert probe.snapshot()[0].utilization_pct == 30
    # No tick between two snapshots: the last figure stands.
    assert probe.snapshot()[0].utilization_pct == 30
    _fake_proc(tmp_path, busy=1130, idle=9070)
    assert probe.snapshot()[0].utilization_pct == 100


def test_cpu_name_without_cpuinfo_model(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal: 1024 kB\nMemAvailable: 512 kB\n")
    _fake_proc(tmp_path, busy=1, idle=1)
    cpu = CpuProbe(proc=tmp_path).snapshot()[0]
    assert cpu.name == (platform.processor() or "cpu")
    assert cpu.memory_total_mb == 1


def test_nvml_that_cannot_count_gpus_falls_back_and_shuts_down(
    monkeypatch: pytest.MonkeyPatch, devices_log: pytest.LogCaptureFixture
) -> None:
    nvml = scripted_nvml("two_gpus")

    def count_fails() -> int:
        raise pynvml.NVMLError_Unknown()

    monkeypatch.setattr(nvml, "nvmlDeviceGetCount", count_fails)
    assert isinstance(make_probe(nvml=nvml), CpuProbe)
    assert nvml.shutdown_calls == 1
    assert [r.getMessage() for r in devices_log.records] == [UNAVAILABLE_LINE % "Unknown Error"]


@pytest.mark.parametrize(
    ("visible", "indices"),
    [(None, [0, 1]), ("1", [1]), ("0,1", [0, 1]), ("7", []), ("", [])],
)
def test_the_daemons_cuda_visible_devices_limits_its_gpus(
    visible: str | None, indices: list[int]
) -> None:
    probe = NvmlProbe(scripted_nvml("two_gpus"), visible=visible)
    assert [gpu.index for gpu in probe.snapshot()] == indices
    probe.close()


def test_visible_devices_may_name_gpus_by_uuid() -> None:
    nvml = scripted_nvml("two_gpus")
    second = nvml.gpus[1].uuid
    probe = NvmlProbe(nvml, visible=f"{second},GPU-ffff")
    assert [gpu.uuid for gpu in probe.snapshot()] == [second]
    probe.close()


def test_no_visible_gpu_falls_back_to_cpu_and_says_why(
    devices_log: pytest.LogCaptureFixture,
) -> None:
    assert isinstance(make_probe(nvml=scripted_nvml("two_gpus"), visible="5"), CpuProbe)
    assert [r.getMessage() for r in devices_log.records] == [
        "devices: NVML started but reports no GPU visible through "
        "CUDA_VISIBLE_DEVICES='5'; offering the CPU as one device"
    ]
