"""The memory one of our trials holds beyond its cap, per device: the one figure that placement
budgets with and the split search's ceiling divides by."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from gpumux.devices.kinds import kind_of
from gpumux.devices.snapshot import DeviceSnapshot

log = logging.getLogger(__name__)

# A measured per-process overhead above this multiple of the configured one is not believed.
OVERHEAD_BELIEVABLE = 4


class Overheads:
    """Per device, what a trial holds beyond its cap: the most measured, else the configured.

    Two measures: a trial seen holding more than its cap (TensorFlow and JAX take their whole
    slice at once, so theirs shows at their first probe; a PyTorch trial's only once its pool
    nears its cap), and the CUDA context of a trial whose framework tells its pool (NVML's
    figure less the pool, measured by the split search), which is what a PyTorch trial holds
    beyond its cap from its first steps on.
    """

    def __init__(self, *, configured_mb: int) -> None:
        self.configured_mb = configured_mb
        self._measured: dict[str, int] = {}
        self._contexts: dict[str, int] = {}

    def for_device(self, device_key: str) -> int:
        """The overhead to budget per trial on this device."""
        seen = [m[device_key] for m in (self._measured, self._contexts) if device_key in m]
        return max(seen, default=self.configured_mb)

    def measured(self) -> dict[str, int]:
        """The overheads measured so far, by device key."""
        return {key: self.for_device(key) for key in self._measured.keys() | self._contexts}

    def context(self, device_key: str, context_mb: int) -> None:
        """A trial on the device showed this CUDA context (NVML's figure less its framework's
        pool): each trial there is budgeted at least the largest so measured."""
        if context_mb > self._contexts.get(device_key, 0):
            log.info(
                "device %s: a trial's CUDA context holds %d MiB beyond its framework's pool",
                device_key,
                context_mb,
            )
            self._contexts[device_key] = context_mb

    def measurable(self, devices: Sequence[DeviceSnapshot]) -> bool:
        """Whether any device lists per-process memory: only then are our processes worth
        listing to measure the overhead."""
        return any(kind_of(device).lists_processes for device in devices)

    def observe(
        self,
        devices: Sequence[DeviceSnapshot],
        *,
        group_of: Mapping[int, int],
        caps: Mapping[int, int],
    ) -> None:
        """Raise each device's overhead to the most a trial of ours was seen to hold beyond its
        cap. `group_of` maps our pids to their trial's process group, `caps` a group to its cap."""
        for device in devices:
            measured = kind_of(device).overhead_beyond_cap(device, group_of, caps)
            if measured is None:
                continue
            if measured > OVERHEAD_BELIEVABLE * self.configured_mb:
                # Far beyond any CUDA context: that trial's cap did not apply (TensorFlow started
                # before the hook, or a framework gpumux does not cap). Not a per-process cost.
                log.warning(
                    "device %s: a trial holds %d MB beyond its slice; its cap did not apply",
                    device.key,
                    measured,
                )
                continue
            if measured > self._measured.get(device.key, 0):
                log.info("device %s: a trial holds %d MB beyond its slice", device.key, measured)
                self._measured[device.key] = measured
