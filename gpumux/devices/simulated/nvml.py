"""A simulated GPU as NVML shows it, and the daemon's probe of it (GPUMUX_SIMULATED_GPU).

The daemon probes it through the same `NvmlProbe` as a real GPU, over a scripted NVML whose one
GPU takes its memory, processes and utilisation from the trials on the device (its state
directory, gpumux.devices.simulated.state) at every snapshot. Everything above the probe
(placement, accounting, supervisors, the split search) is the real daemon's.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

from gpumux.devices.probes import NvmlProbe
from gpumux.devices.scripted import ScriptedGpu, ScriptedHandle, ScriptedNvml, ScriptedProcess
from gpumux.devices.simulated.model import DeviceModel
from gpumux.devices.simulated.state import (
    Device,
    census,
    device_dir,
    load_model,
    remove_if_idle,
    write_device,
)

log = logging.getLogger(__name__)


def simulated_name(model: DeviceModel, time_scale: float) -> str:
    """The name NVML shows: the model's, marked simulated (and scaled), so that profiles
    measured on it are never taken for a real GPU's."""
    if time_scale == 1:
        return f"{model.name} (simulated)"
    return f"{model.name} (simulated, time x{time_scale:g})"


def simulated_uuid(home: Path, model: DeviceModel) -> str:
    """A UUID of NVML's shape, the same for one data directory and model across restarts (so
    that a restarted daemon finds the trials it adopts), another for any other."""
    name = f"gpumux-simulated:{home.resolve()}:{model.name}"
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, name)}"


class SimulatedNvml(ScriptedNvml):
    """NVML with one GPU, the simulated device, refreshed from its trials at every snapshot."""

    def __init__(self, device: Device, *, uuid: str, directory: str) -> None:
        gpu = ScriptedGpu(
            name=simulated_name(device.model, device.time_scale),
            uuid=uuid,
            total_mb=device.model.memory_mb,
            used_mb=0,
            utilization_pct=0,
        )
        super().__init__([gpu])
        self.device = device
        self.directory = directory

    def nvmlDeviceGetHandleByIndex(self, index: int) -> ScriptedHandle:
        """The handle; the GPU's figures are read from its trials now, once per snapshot."""
        handle = super().nvmlDeviceGetHandleByIndex(index)
        self._refresh(self.gpus[index])
        return handle

    def nvmlShutdown(self) -> None:
        """Shut down; the device's directory goes too when no trial is left on it."""
        super().nvmlShutdown()
        remove_if_idle(self.directory)

    def _refresh(self, gpu: ScriptedGpu) -> None:
        model = self.device.model
        present = census(self.directory, remove_dead=True)
        gpu.processes = [ScriptedProcess(pid=pid, used_mb=mb) for pid, mb in present.memory if mb]
        gpu.used_mb = min(model.memory_mb, sum(mb for _, mb in present.memory))
        # The share of the device's best rate that the trials computing now reach.
        best = max(rate for _, rate in model.throughput)
        reached = model.aggregate(present.computing) / best if present.computing else 0.0
        gpu.utilization_pct = round(100 * min(1.0, reached))


def open_simulated(model: str | os.PathLike[str], *, home: Path, time_scale: float) -> NvmlProbe:
    """The daemon's probe of the simulated GPU a model file (or shipped model) describes."""
    device = Device(model=load_model(model), time_scale=time_scale)
    gpu_uuid = simulated_uuid(home, device.model)
    directory = device_dir(gpu_uuid)
    write_device(directory, device)
    log.warning(
        "devices: SIMULATED GPU %r from %s (time x%g, state in %s): no real GPU is used; its "
        "trials must be simulated ones (python -m gpumux.devices.simulated.trial)",
        device.model.name,
        model,
        time_scale,
        directory,
    )
    return NvmlProbe(SimulatedNvml(device, uuid=gpu_uuid, directory=directory))
