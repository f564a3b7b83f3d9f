"""Device kinds, one class each (see base.DeviceKind), and the kind of a probed device."""

from __future__ import annotations

from gpumux.devices.kinds.base import DeviceKind
from gpumux.devices.kinds.cpu import CpuKind
from gpumux.devices.kinds.gpu import GpuKind
from gpumux.devices.snapshot import DeviceSnapshot

KINDS: dict[str, DeviceKind] = {kind.name: kind for kind in (GpuKind(), CpuKind())}


def kind_of(device: DeviceSnapshot) -> DeviceKind:
    """The kind that decides how trials share this device; ValueError for an unknown kind."""
    try:
        return KINDS[device.kind]
    except KeyError:
        known = ", ".join(sorted(KINDS))
        raise ValueError(
            f"device {device.key}: unknown kind {device.kind!r} (known: {known}); "
            "a new kind is a DeviceKind subclass added to gpumux.devices.kinds.KINDS"
        ) from None
