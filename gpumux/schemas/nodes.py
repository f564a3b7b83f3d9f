"""The daemons on a shared database and the devices each saw."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, Field

from gpumux.devices.snapshot import DeviceSummary
from gpumux.status import NodeState


# The fields are DeviceSummary's, written once there: what a node's row holds is what the API
# shows of it.
@dataclass(frozen=True)
class NodeDevice(DeviceSummary):
    """A device as its node's probe saw it at its last heartbeat."""


class NodePublic(BaseModel):
    """A daemon on the shared database: where it serves, its devices, its lease and its load."""

    id: int
    name: str
    state: NodeState
    incarnation: int
    url: str | None = Field(description="where its API serves the other nodes; null: no TCP")
    pid: int
    devices: list[NodeDevice]
    started_at: datetime
    heartbeat_at: datetime
    lease_until: datetime
    live: bool = Field(description="active and its lease not yet run out, now")
    active_trials: int = Field(description="how many trials hold a slot on it")
