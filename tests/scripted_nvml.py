"""NVML on a machine with GPUs, in named scenarios, through the package's scripted NVML."""

from __future__ import annotations

from collections.abc import Callable

import pynvml

from gpumux.devices.scripted import ScriptedGpu, ScriptedHandle, ScriptedNvml, ScriptedProcess

__all__ = ["ScriptedGpu", "ScriptedHandle", "ScriptedNvml", "ScriptedProcess", "scripted_nvml"]

H100_MB = 81559
H100_NAME = "NVIDIA H100 80GB HBM3"
FOREIGN_PID = 424242


def _h100(index: int, used_mb: int, utilization_pct: int) -> ScriptedGpu:
    return ScriptedGpu(
        name=H100_NAME,
        uuid=f"GPU-0b5c1e6a-3f2d-4c1b-9a7e-00000000000{index}",
        total_mb=H100_MB,
        used_mb=used_mb,
        utilization_pct=utilization_pct,
    )


def _two_gpus() -> ScriptedNvml:
    first = _h100(0, used_mb=4618, utilization_pct=37)
    first.processes = [ScriptedProcess(pid=31001, used_mb=4096)]
    return ScriptedNvml([first, _h100(1, used_mb=522, utilization_pct=0)])


def _one_failing() -> ScriptedNvml:
    nvml = _two_gpus()
    nvml.gpus[1].handle_error = pynvml.NVMLError_GpuIsLost
    return nvml


def _one_failing_field() -> ScriptedNvml:
    nvml = _two_gpus()
    nvml.gpus[0].failing = {"utilization"}
    return nvml


def _foreign_memory() -> ScriptedNvml:
    nvml = _two_gpus()
    nvml.gpus[0].used_mb = 30522
    nvml.gpus[0].processes = [ScriptedProcess(pid=FOREIGN_PID, used_mb=30000)]
    return nvml


def _no_driver() -> ScriptedNvml:
    return ScriptedNvml([], init_error=pynvml.NVMLError_DriverNotLoaded)


def _no_library() -> ScriptedNvml:
    return ScriptedNvml([], init_error=pynvml.NVMLError_LibraryNotFound)


def _no_gpus() -> ScriptedNvml:
    return ScriptedNvml([])


def _old_driver() -> ScriptedNvml:
    nvml = _two_gpus()
    nvml.old_driver = True
    nvml.strings_as_bytes = True
    return nvml


SCENARIOS: dict[str, Callable[[], ScriptedNvml]] = {
    "two_gpus": _two_gpus,
    "one_failing": _one_failing,
    "one_failing_field": _one_failing_field,
    "foreign_memory": _foreign_memory,
    "no_driver": _no_driver,
    "no_library": _no_library,
    "no_gpus": _no_gpus,
    "old_driver": _old_driver,
}


def scripted_nvml(name: str) -> ScriptedNvml:
    """A fresh ScriptedNvml in the named scenario (see SCENARIOS)."""
    return SCENARIOS[name]()
