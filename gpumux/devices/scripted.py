"""A stand-in for the pynvml module: NVML answering from data, for machines without a GPU.

It raises the real pynvml exception classes, so the code that uses it meets the types it meets
on a real driver. Its state is plain mutable data: a test changes `gpus[0].used_mb` or
`gpus[1].handle_error` between snapshots, and the simulated GPU (gpumux.devices.simulated)
refreshes it from its trials. The test scenarios are in tests/scripted_nvml.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml

MIB = 2**20


@dataclass
class ScriptedProcess:
    """A compute process on a scripted GPU; used_mb None is NVML_VALUE_NOT_AVAILABLE."""

    pid: int
    used_mb: int | None


@dataclass
class ScriptedGpu:
    """One scripted GPU; `failing` names fields whose query raises `field_error`."""

    name: str
    uuid: str
    total_mb: int
    used_mb: int
    utilization_pct: int
    processes: list[ScriptedProcess] = field(default_factory=list)
    handle_error: type[pynvml.NVMLError] | None = None
    failing: set[str] = field(default_factory=set)
    field_error: type[pynvml.NVMLError] = pynvml.NVMLError_NotSupported


@dataclass(frozen=True)
class ScriptedHandle:
    """What nvmlDeviceGetHandleByIndex returns: only the index, checked on every use."""

    index: int


class ScriptedNvml:
    """The subset of pynvml that gpumux.devices.probes calls, answering from `gpus`."""

    NVMLError = pynvml.NVMLError
    NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError

    def __init__(
        self,
        gpus: list[ScriptedGpu],
        *,
        init_error: type[pynvml.NVMLError] | None = None,
        strings_as_bytes: bool = False,
        old_driver: bool = False,
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.strings_as_bytes = strings_as_bytes
        self.old_driver = old_driver
        self.init_calls = 0
        self.shutdown_calls = 0
        self.initialised = False

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error()
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._require_init()
        self.shutdown_calls += 1
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._require_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> ScriptedHandle:
        self._require_init()
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        error = self.gpus[index].handle_error
        if error is not None:
            raise error()
        return ScriptedHandle(index)

    def nvmlDeviceGetName(self, handle: ScriptedHandle) -> str | bytes:
        return self._string(self._query(handle, "name").name)

    def nvmlDeviceGetUUID(self, handle: ScriptedHandle) -> str | bytes:
        return self._string(self._query(handle, "uuid").uuid)

    def nvmlDeviceGetMemoryInfo(self, handle: ScriptedHandle) -> SimpleNamespace:
        gpu = self._query(handle, "memory")
        return SimpleNamespace(
            total=gpu.total_mb * MIB,
            used=gpu.used_mb * MIB,
            free=(gpu.total_mb - gpu.used_mb) * MIB,
        )

    def nvmlDeviceGetUtilizationRates(self, handle: ScriptedHandle) -> SimpleNamespace:
        return SimpleNamespace(gpu=self._query(handle, "utilization").utilization_pct, memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: ScriptedHandle) -> list[SimpleNamespace]:
        if self.old_driver:
            # What pynvml's throwOnVersionMismatch raises when the driver lacks the _v3 symbol.
            raise pynvml.NVMLLibraryMismatchError("Unversioned function called")
        return self.nvmlDeviceGetComputeRunningProcesses_v2(handle)

    def nvmlDeviceGetComputeRunningProcesses_v2(
        self, handle: ScriptedHandle
    ) -> list[SimpleNamespace]:
        gpu = self._query(handle, "processes")
        return [
            SimpleNamespace(
                pid=p.pid,
                usedGpuMemory=None if p.used_mb is None else p.used_mb * MIB,
                gpuInstanceId=0xFFFFFFFF,
                computeInstanceId=0xFFFFFFFF,
            )
            for p in gpu.processes
        ]

    def _require_init(self) -> None:
        if not self.initialised:
            raise pynvml.NVMLError_Uninitialized()

    def _query(self, handle: ScriptedHandle, what: str) -> ScriptedGpu:
        self._require_init()
        if not isinstance(handle, ScriptedHandle):
            raise pynvml.NVMLError_InvalidArgument()
        gpu = self.gpus[handle.index]
        if what in gpu.failing:
            raise gpu.field_error()
        return gpu

    def _string(self, value: str) -> str | bytes:
        return value.encode() if self.strings_as_bytes else value
