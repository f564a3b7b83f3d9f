"""A device as last probed, with the trials and sweeps packed on it."""

from __future__ import annotations

from pydantic import BaseModel, Field

from gpumux.devices.kinds import KINDS

KIND_DESCRIPTION = "how trials share it: " + ", ".join(
    f"{name} ({kind.shared_by})" for name, kind in KINDS.items()
)


class DeviceTrial(BaseModel):
    trial_id: int
    sweep_id: int
    slot: int | None
    memory_limit_mb: int | None
    samples_per_s: float | None


class DeviceShare(BaseModel):
    """The trials of one sweep launched at one split on a device, and the part of it they hold."""

    sweep_id: int
    owner: str | None = Field(
        description="the sweep's owner; null for another user's sweep (only admins see whose)"
    )
    name: str | None = Field(description="the sweep's name; null when unnamed or not the caller's")
    split: int = Field(description="the N its trials were launched under: each holds 1/N")
    trials: int = Field(description="how many of its trials hold a slot on the device")
    share: float = Field(description="trials/split: the part of the device they hold")


class DevicePublic(BaseModel):
    """A device as last probed, with the trials packed on it and the mix of sweeps they are."""

    key: str
    kind: str = Field(description=KIND_DESCRIPTION)
    index: int
    name: str
    uuid: str | None
    memory_total_mb: int | None
    memory_used_mb: int | None
    memory_free_mb: int | None
    utilization_pct: int | None
    cpu_count: int | None = Field(
        description="the host's cores its trials share: all of them for the CPU device, an "
        "equal block of them for each GPU; a trial gets 1/N as threads"
    )
    work_cores: int | None = Field(
        default=None,
        description="the cores that do its trials' work, which bound what N of them do together "
        "(the CPU device's); null where the device itself computes (a GPU) or its cores are not "
        "known (another node's device)",
    )
    error: str | None
    trials: list[DeviceTrial]
    mix: list[DeviceShare] = Field(description="the sweeps on the device, by sweep id and split")
    load: float = Field(description="the sum of the mix's shares: 1 is a full device")
    load_fraction: str = Field(description='the load as an exact fraction: "0", "5/6", "1"')
    node: str | None = Field(
        default=None, description="the node the device is on; null for a daemon that is no node"
    )
