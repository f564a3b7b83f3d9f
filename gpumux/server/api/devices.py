"""Route for the devices as last probed, with the trials packed on each and their mix."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from fractions import Fraction

from fastapi import APIRouter, Depends

from gpumux.schemas import DevicePublic, DeviceShare, DeviceTrial
from gpumux.server.api.deps import Caller, CallerDep, ReadSessionDep, StateDep, get_caller
from gpumux.server.api.responses import AUTHENTICATED, problems
from gpumux.storage import store
from gpumux.storage.models import Trial

# Any user the daemon accepts may look; over TCP that takes a token.
router = APIRouter(
    tags=["devices"], dependencies=[Depends(get_caller)], responses=problems(*AUTHENTICATED)
)


def device_mixes(trials: Sequence[Trial], caller: Caller) -> dict[str, list[DeviceShare]]:
    """Per device, the sweeps its trials belong to and the share each holds (trials/split).

    Every user sees every sweep's id and share, as the trials listed on a device show them;
    its owner and name only where the caller may see the sweep itself.
    """
    held = Counter(
        (trial.device, trial.sweep_id, trial.split)
        for trial in trials
        if trial.device is not None and trial.split is not None
    )
    sweeps = {trial.sweep_id: trial.sweep for trial in trials}
    mixes: dict[str, list[DeviceShare]] = {}
    for (device, sweep_id, split), count in sorted(held.items()):
        sweep = sweeps[sweep_id]
        shown = caller.may_touch(sweep.owner.name)
        mixes.setdefault(device, []).append(
            DeviceShare(
                sweep_id=sweep_id,
                owner=sweep.owner.name if shown else None,
                name=sweep.name if shown else None,
                split=split,
                trials=count,
                share=count / split,
            )
        )
    return mixes


def device_trial(trial: Trial) -> DeviceTrial:
    return DeviceTrial(
        trial_id=trial.id,
        sweep_id=trial.sweep_id,
        slot=trial.slot,
        memory_limit_mb=trial.memory_limit_mb,
        samples_per_s=trial.samples_per_s,
    )


@router.get("/devices")
def list_devices(state: StateDep, session: ReadSessionDep, caller: CallerDep) -> list[DevicePublic]:
    """Every device the scheduler sees: memory, utilisation, its running trials and their mix."""
    active = store.active_trials(session=session)
    packed: dict[str, list[DeviceTrial]] = {}
    for trial in active:
        if trial.device is not None:
            packed.setdefault(trial.device, []).append(device_trial(trial))
    mixes = device_mixes(active, caller)
    devices = []
    for snapshot in state.devices_view():
        fields = asdict(snapshot)
        fields.pop("processes")
        mix = mixes.get(snapshot.key, [])
        # Exact: six trials at split 6 are a full device, where floats sum to 0.9999999999999999.
        load = sum((Fraction(share.trials, share.split) for share in mix), Fraction(0))
        devices.append(
            DevicePublic(
                **fields,
                trials=packed.get(snapshot.key, []),
                mix=mix,
                load=float(load),
                load_fraction=str(load),
            )
        )
    return devices
