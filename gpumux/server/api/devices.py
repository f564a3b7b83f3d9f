"""Route for the devices as last probed, with the trials packed on each."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Depends

from gpumux.schemas import DevicePublic, DeviceTrial
from gpumux.server.api.deps import ReadSessionDep, StateDep, get_caller
from gpumux.server.api.responses import AUTHENTICATED, problems
from gpumux.storage import store

# Any user the daemon accepts may look; over TCP that takes a token.
router = APIRouter(
    tags=["devices"], dependencies=[Depends(get_caller)], responses=problems(*AUTHENTICATED)
)


@router.get("/devices")
def list_devices(state: StateDep, session: ReadSessionDep) -> list[DevicePublic]:
    """Every device the scheduler sees: memory, utilisation, and its running trials."""
    packed: dict[str, list[DeviceTrial]] = {}
    for trial in store.active_trials(session=session):
        if trial.device is not None:
            packed.setdefault(trial.device, []).append(
                DeviceTrial(
                    trial_id=trial.id,
                    sweep_id=trial.sweep_id,
                    slot=trial.slot,
                    memory_limit_mb=trial.memory_limit_mb,
                    samples_per_s=trial.samples_per_s,
                )
            )
    devices = []
    for snapshot in state.devices_view():
        fields = asdict(snapshot)
        fields.pop("processes")
        devices.append(DevicePublic(**fields, trials=packed.get(snapshot.key, [])))
    return devices
