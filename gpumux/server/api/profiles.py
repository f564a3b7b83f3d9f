"""Routes for throughput profiles: the curves the split search measured, per device and workload."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, status

from gpumux.devices.kinds import kind_of
from gpumux.schemas.profiles import ProfileMeasured, ProfilePublic, ProfilesPublic
from gpumux.server.api.deps import Offset, ProfileId, ReadSessionDep, StateDep, get_caller
from gpumux.server.api.responses import AUTHENTICATED, problems
from gpumux.splits.curve import workload_fingerprint
from gpumux.storage import profiles as profile_store

# Any user the daemon accepts may look; over TCP that takes a token.
router = APIRouter(
    tags=["profiles"],
    dependencies=[Depends(get_caller)],
    responses=problems(*AUTHENTICATED, 422),
)


@router.get("/profiles")
def list_profiles(
    session: ReadSessionDep,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> ProfilesPublic:
    """Stored profiles, the most recently updated first."""
    profiles, count = profile_store.list_profiles(session=session, offset=offset, limit=limit)
    return ProfilesPublic(
        data=[ProfilePublic.model_validate(profile) for profile in profiles], count=count
    )


@router.get("/profiles/{profile_id}", responses=problems(404))
def get_profile(profile_id: ProfileId, session: ReadSessionDep) -> ProfilePublic:
    """One profile: aggregate throughput, time and memory per trial at each N, and the best N."""
    profile = profile_store.get_profile_by_id(session=session, profile_id=profile_id)
    if profile is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"profile {profile_id} not found")
    return ProfilePublic.model_validate(profile)


@router.put("/profiles", responses=problems(422))
def store_measured(measured: ProfileMeasured, state: StateDep) -> ProfilePublic:
    """Keep a curve measured outside a sweep (`gpumux tune`) as its workload's profile on the
    device's model, settled at its best N: what a sweep of that command in that directory at
    `auto` reads first."""
    devices = state.devices_view()
    device = next((d for d in devices if d.key == measured.device), None) or next(
        (d for d in devices if d.name == measured.device_name), None
    )
    if device is None:
        known = ", ".join(f"{d.key} ({d.name})" for d in devices) or "none"
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"device {measured.device} ({measured.device_name}) is not one of this daemon's "
            f"(its devices: {known})",
        )
    with state.sessions.write.begin() as session:
        profile = profile_store.save_profile(
            session=session,
            device_name=kind_of(device).model_name(device),
            # As a sweep of this command names its workload (no parameter changes its cost).
            fingerprint=workload_fingerprint([measured.workdir, *measured.command], []),
            command=measured.command,
            workdir=measured.workdir,
            param_tokens=[],
            unit=measured.unit,
            curve=[point.to_json() for point in measured.curve],
            best_split=measured.best_split,
            settled=True,
            reason=measured.reason,
            sweep_id=None,
        )
        return ProfilePublic.model_validate(profile)
