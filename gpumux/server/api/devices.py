"""Route for the devices of every node, with the trials packed on each and their mix."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from fractions import Fraction

from fastapi import APIRouter, Depends

from gpumux.devices.kinds import KINDS
from gpumux.devices.snapshot import DeviceSnapshot, DeviceSummary
from gpumux.schemas.devices import DevicePublic, DeviceShare, DeviceTrial
from gpumux.server.api.deps import Caller, CallerDep, ReadSessionDep, StateDep, get_caller
from gpumux.server.api.responses import AUTHENTICATED, problems
from gpumux.storage import nodes
from gpumux.storage import trials as trial_store
from gpumux.storage.models import Node, Trial

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
    """Every device of every active node: memory, utilisation, its trials and their mix.

    This node's devices as its probe sees them now; another node's as its last heartbeat
    wrote them, with the trials whose attempt is on that node.
    """
    active = trial_store.active_trials(session=session)
    here = state.node
    if here is None:
        return node_devices(state.devices_view(), active, caller, node=None)
    # Trials from before nodes (node_id NULL) ran on the one daemon there was: this one.
    mine = [trial for trial in active if trial.node_id in (here.id, None)]
    found = node_devices(state.devices_view(), mine, caller, node=here.name)
    for node in nodes.active_nodes(session=session):
        if node.id != here.id:
            theirs = [trial for trial in active if trial.node_id == node.id]
            found += node_devices(heartbeat_snapshots(node), theirs, caller, node=node.name)
    return found


def work_cores(snapshot: DeviceSnapshot) -> int | None:
    """What the device's kind says does its trials' work; None where it computes itself, where
    its cores are not known (another node's, from its heartbeat), or of a kind this daemon does
    not know (a newer node's)."""
    kind = KINDS.get(snapshot.kind)
    if kind is None or snapshot.cpu_count is None:
        return None
    return kind.work_cores(snapshot)


def heartbeat_snapshots(node: Node) -> list[DeviceSnapshot]:
    """A node's devices as its last heartbeat wrote them: what they are, not how busy."""
    return [
        summary.snapshot()
        for summary in map(DeviceSummary.read, node.devices)
        if summary is not None
    ]


def node_devices(
    snapshots: Sequence[DeviceSnapshot],
    trials: Sequence[Trial],
    caller: Caller,
    node: str | None,
) -> list[DevicePublic]:
    """The devices of one node, each with the trials on it (all of them on that node)."""
    packed: dict[str, list[DeviceTrial]] = {}
    for trial in trials:
        if trial.device is not None:
            packed.setdefault(trial.device, []).append(device_trial(trial))
    mixes = device_mixes(trials, caller)
    devices = []
    for snapshot in snapshots:
        fields = asdict(snapshot)
        # The scheduler's, not shown: NVML's processes (the device's trials are listed instead)
        # and the ids of its cores (cpu_count and work_cores say how many). DevicePublic would
        # ignore them unsaid.
        del fields["processes"], fields["cpu_cores"]
        mix = mixes.get(snapshot.key, [])
        # Exact: six trials at split 6 are a full device, where floats sum to 0.9999999999999999.
        load = sum((Fraction(share.trials, share.split) for share in mix), Fraction(0))
        devices.append(
            DevicePublic(
                **fields,
                work_cores=work_cores(snapshot),
                trials=packed.get(snapshot.key, []),
                mix=mix,
                load=float(load),
                load_fraction=str(load),
                node=node,
            )
        )
    return devices
