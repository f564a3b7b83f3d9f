"""What a device looked like at one moment, and which GPUs a daemon may use: plain data, no I/O."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class GpuProcess:
    """A process with a compute context on a GPU, and the memory NVML says it holds."""

    pid: int
    used_memory_mb: int | None


@dataclass(frozen=True)
class DeviceSnapshot:
    """One device at one moment; a field NVML could not read is None.

    `kind` names the device's kind (gpumux.devices.kinds), which decides how trials share it.
    `cpu_cores` are the host's cores (ids) this device's trials share, `cpu_count` how many: all
    the daemon may use for the CPU device, an equal block of them for each GPU it uses.
    """

    key: str
    kind: str
    index: int
    name: str
    uuid: str | None
    memory_total_mb: int | None
    memory_used_mb: int | None
    memory_free_mb: int | None
    utilization_pct: int | None
    processes: tuple[GpuProcess, ...] | None
    cpu_count: int | None
    error: str | None = None
    cpu_cores: tuple[int, ...] | None = None


@dataclass(frozen=True)
class DeviceSummary:
    """A device as its node's row describes it to the other nodes and the API: written at
    each heartbeat, read by every node, whatever gpumux version wrote it (`read` gives None
    for an entry of another shape)."""

    key: str
    kind: str
    name: str
    memory_mb: int | None = None

    @classmethod
    def of(cls, device: DeviceSnapshot) -> DeviceSummary:
        return cls(
            key=device.key, kind=device.kind, name=device.name, memory_mb=device.memory_total_mb
        )

    def row(self) -> dict[str, Any]:
        """The entry stored in the node's row (the API's NodeDevice has the same fields)."""
        return asdict(self)

    @classmethod
    def read(cls, entry: object) -> DeviceSummary | None:
        """The summary an entry of a node's row holds; None for one of another shape."""
        if not isinstance(entry, dict):
            return None
        key, kind, name = entry.get("key"), entry.get("kind"), entry.get("name")
        memory = entry.get("memory_mb")
        if not (isinstance(key, str) and isinstance(kind, str) and isinstance(name, str)):
            return None
        if not (memory is None or type(memory) is int):
            return None
        return cls(key=key, kind=kind, name=name, memory_mb=memory)

    def snapshot(self) -> DeviceSnapshot:
        """The device as it is, idle: what it is, not how busy."""
        # "gpu:3" is GPU 3; a device of one per host ("cpu") is its kind's first.
        suffix = self.key.rpartition(":")[2]
        return DeviceSnapshot(
            key=self.key,
            kind=self.kind,
            index=int(suffix) if suffix.isascii() and suffix.isdigit() else 0,
            name=self.name,
            uuid=None,
            memory_total_mb=self.memory_mb,
            memory_used_mb=None,
            memory_free_mb=None,
            utilization_pct=None,
            processes=None,
            cpu_count=None,
        )


def core_blocks(cores: Collection[int], devices: int) -> list[tuple[int, ...]]:
    """The cores split into `devices` equal blocks of neighbours (a core left over stays
    unused, so no block is larger); every device gets the cores when there are fewer."""
    ordered = tuple(sorted(cores))
    size = len(ordered) // devices if devices else 0
    if size == 0:
        return [ordered] * devices
    return [ordered[i * size : (i + 1) * size] for i in range(devices)]


def is_visible(gpu: DeviceSnapshot, visible: str | None) -> bool:
    """Whether CUDA_VISIBLE_DEVICES (indices or UUIDs, comma-separated; None: all) shows the GPU."""
    if visible is None:
        return True
    for entry in (part.strip() for part in visible.split(",")):
        if entry == str(gpu.index):
            return True
        if entry.startswith("GPU-") and gpu.uuid is not None and gpu.uuid.startswith(entry):
            return True
    return False


def visible_gpus(gpus: str | None, environ: Mapping[str, str]) -> str | None:
    """The GPUs a daemon may use: its `gpus` setting, else its own CUDA_VISIBLE_DEVICES.

    A daemon given some GPUs of a host (by Slurm, or by hand) packs trials onto those alone;
    None means every GPU.
    """
    return gpus if gpus is not None else environ.get("CUDA_VISIBLE_DEVICES")
