"""What devices the host offers: GPUs through NVML, or the host CPU as one device without it."""

from __future__ import annotations

import atexit
import logging
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, TypeVar

from gpumux.devices.kinds.cpu import CpuKind
from gpumux.devices.kinds.gpu import GpuKind
from gpumux.devices.snapshot import DeviceSnapshot, GpuProcess, core_blocks, is_visible

logger = logging.getLogger(__name__)

MIB = 2**20
T = TypeVar("T")


class DeviceProbe(Protocol):
    """Lists the devices trials can be placed on."""

    def snapshot(self) -> list[DeviceSnapshot]: ...

    def close(self) -> None: ...


class NvmlUnavailable(RuntimeError):
    """NVML cannot start (no driver, no library); str() is the NVMLError text."""


def _text(value: bytes | str) -> str:
    # pynvml before 11.5 returns bytes for names and UUIDs.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class NvmlProbe:
    """The GPUs NVML reports; starts NVML on the first snapshot and shuts it down at exit."""

    def __init__(
        self,
        nvml: ModuleType | Any | None = None,
        *,
        visible: str | None = None,
        cores: Sequence[int] | None = None,
    ) -> None:
        # The pynvml module or a stand-in with its names; pynvml ships no type hints.
        self._nvml: Any = nvml
        self._started = False
        self._visible = visible
        # The host's cores the GPUs' trials share (None: the daemon's own, read at each probe).
        self._cores = cores

    def _start(self) -> Any:
        if self._nvml is None:
            # Imported here so that importing gpumux.devices.probes never touches the driver.
            import pynvml

            self._nvml = pynvml
        if not self._started:
            try:
                self._nvml.nvmlInit()
            except self._nvml.NVMLError as exc:
                raise NvmlUnavailable(str(exc)) from exc
            self._started = True
            atexit.register(self.close)
        return self._nvml

    def snapshot(self) -> list[DeviceSnapshot]:
        """One snapshot per GPU, each with its block of the host's cores; raises NvmlUnavailable
        when NVML cannot start or count GPUs."""
        nvml = self._start()
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(str(exc)) from exc
        snapshots = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError as exc:
                snapshots.append(_failed_gpu(index, str(exc)))
                continue
            snapshots.append(self._read_gpu(index, handle))
        gpus = [gpu for gpu in snapshots if is_visible(gpu, self._visible)]
        cores = self._cores if self._cores is not None else os.sched_getaffinity(0)
        return [
            replace(gpu, cpu_count=len(block), cpu_cores=block)
            for gpu, block in zip(gpus, core_blocks(cores, len(gpus)), strict=True)
        ]

    def close(self) -> None:
        """Shut NVML down if this probe started it."""
        if not self._started:
            return
        self._started = False
        atexit.unregister(self.close)
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            logger.debug("devices: nvmlShutdown failed: %s", exc)

    def _field(self, index: int, what: str, query: Callable[[Any], T], handle: Any) -> T | None:
        # One unreadable field (Not Supported on this board, GPU lost) must not hide the others.
        try:
            return query(handle)
        except self._nvml.NVMLError as exc:
            logger.debug("devices: GPU %d %s unreadable: %s", index, what, exc)
            return None

    def _read_gpu(self, index: int, handle: Any) -> DeviceSnapshot:
        nvml = self._nvml
        name = self._field(index, "name", nvml.nvmlDeviceGetName, handle)
        uuid = self._field(index, "uuid", nvml.nvmlDeviceGetUUID, handle)
        memory = self._field(index, "memory", nvml.nvmlDeviceGetMemoryInfo, handle)
        rates = self._field(index, "utilization", nvml.nvmlDeviceGetUtilizationRates, handle)
        uuid_text = None if uuid is None else _text(uuid)
        return DeviceSnapshot(
            key=uuid_text if uuid_text is not None else f"gpu:{index}",
            kind=GpuKind.name,
            index=index,
            name="unknown GPU" if name is None else _text(name),
            uuid=uuid_text,
            memory_total_mb=None if memory is None else int(memory.total) // MIB,
            memory_used_mb=None if memory is None else int(memory.used) // MIB,
            memory_free_mb=None if memory is None else int(memory.free) // MIB,
            utilization_pct=None if rates is None else int(rates.gpu),
            processes=self._processes(index, handle),
            cpu_count=None,
        )

    def _processes(self, index: int, handle: Any) -> tuple[GpuProcess, ...] | None:
        nvml = self._nvml
        try:
            found = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except nvml.NVMLLibraryMismatchError:
            # A driver older than these bindings lacks the _v3 entry point; _v2 has the same fields.
            found = self._field(
                index, "processes", nvml.nvmlDeviceGetComputeRunningProcesses_v2, handle
            )
        except nvml.NVMLError as exc:
            logger.debug("devices: GPU %d processes unreadable: %s", index, exc)
            return None
        if found is None:
            return None
        return tuple(
            GpuProcess(
                pid=int(p.pid),
                used_memory_mb=None if p.usedGpuMemory is None else int(p.usedGpuMemory) // MIB,
            )
            for p in found
        )


def _failed_gpu(index: int, error: str) -> DeviceSnapshot:
    return DeviceSnapshot(
        key=f"gpu:{index}",
        kind=GpuKind.name,
        index=index,
        name="unknown GPU",
        uuid=None,
        memory_total_mb=None,
        memory_used_mb=None,
        memory_free_mb=None,
        utilization_pct=None,
        processes=None,
        cpu_count=None,
        error=error,
    )


class CpuProbe:
    """The host CPU as one device, for machines without a GPU."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = proc
        self._name = _cpu_model_name(proc / "cpuinfo")
        self._last_times: tuple[int, int] | None = None
        self._last_utilization: int | None = None

    def snapshot(self) -> list[DeviceSnapshot]:
        """The CPU device: memory from meminfo, utilisation since the previous snapshot."""
        meminfo = _read_meminfo(self._proc / "meminfo")
        total = meminfo.get("MemTotal")
        available = meminfo.get("MemAvailable")
        used = None if total is None or available is None else total - available
        cores = tuple(sorted(os.sched_getaffinity(0)))
        return [
            DeviceSnapshot(
                key="cpu",
                kind=CpuKind.name,
                index=0,
                name=self._name,
                uuid=None,
                memory_total_mb=total,
                memory_used_mb=used,
                memory_free_mb=available,
                utilization_pct=self._utilization(),
                processes=None,
                cpu_count=len(cores),
                cpu_cores=cores,
            )
        ]

    def close(self) -> None:
        """Nothing to release."""

    def _utilization(self) -> int | None:
        busy, total = _read_cpu_times(self._proc / "stat")
        if self._last_times is None:
            self._last_times = (busy, total)
            return None
        elapsed = total - self._last_times[1]
        # Within one clock tick the counters have not moved: keep the last figure and baseline.
        if elapsed <= 0:
            return self._last_utilization
        worked = busy - self._last_times[0]
        self._last_times = (busy, total)
        self._last_utilization = max(0, min(100, round(100 * worked / elapsed)))
        return self._last_utilization


def _cpu_model_name(cpuinfo: Path) -> str:
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        label, _, value = line.partition(":")
        if label.strip() == "model name" and value.strip():
            return value.strip()
    return platform.processor() or "cpu"


def _read_meminfo(path: Path) -> dict[str, int]:
    """MiB per /proc/meminfo field that is given in kB."""
    fields = {}
    for line in path.read_text().splitlines():
        label, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB":
            fields[label] = int(parts[0]) // 1024
    return fields


def _read_cpu_times(path: Path) -> tuple[int, int]:
    """(busy, total) jiffies summed over all CPUs from the first line of /proc/stat."""
    # user nice system idle iowait irq softirq steal; guest time is already inside user.
    ticks = [int(v) for v in path.read_text().splitlines()[0].split()[1:9]]
    idle = ticks[3] + ticks[4]
    total = sum(ticks)
    return total - idle, total


def make_probe(*, nvml: Any | None = None, visible: str | None = None) -> DeviceProbe:
    """NVML's GPUs when NVML starts and sees one, otherwise the host CPU as one device.

    `visible` is the daemon's own CUDA_VISIBLE_DEVICES: a daemon given some GPUs of a host
    (by Slurm, or by hand) packs trials onto those alone.
    """
    probe = NvmlProbe(nvml, visible=visible)
    try:
        gpus = probe.snapshot()
    except NvmlUnavailable as exc:
        logger.warning("devices: NVML unavailable (%s); offering the CPU as one device", exc)
        probe.close()
        return CpuProbe()
    if not gpus:
        shown = "" if visible is None else f" visible through CUDA_VISIBLE_DEVICES={visible!r}"
        logger.warning(
            "devices: NVML started but reports no GPU%s; offering the CPU as one device", shown
        )
        probe.close()
        return CpuProbe()
    return probe
