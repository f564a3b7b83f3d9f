"""The memory one of our trials holds beyond its cap, per device: the one figure that placement
budgets with and the split search's ceiling divides by."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from gpumux.devices.kinds import kind_of
from gpumux.devices.overhead import trial_overhead_mb
from gpumux.devices.snapshot import DeviceSnapshot

log = logging.getLogger(__name__)

# A measured per-process overhead above this multiple of the configured one is not believed.
OVERHEAD_BELIEVABLE = 4


class Overheads:
    """Per device, what a trial holds beyond its cap: the most measured, else the configured."""

    def __init__(self, *, configured_mb: int) -> None:
        self.configured_mb = configured_mb
        self._measured: dict[str, int] = {}

    def for_device(self, device_key: str, context_mb: int | None = None) -> int:
        """The overhead to budget per trial on this device (of a workload whose CUDA context
        was measured at `context_mb`)."""
        return trial_overhead_mb(
            configured=self.configured_mb,
            seen=self._measured.get(device_key),
            context=context_mb,
        )

    def measured(self) -> dict[str, int]:
        """The overheads measured so far, by device key (a copy)."""
        return dict(self._measured)

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
