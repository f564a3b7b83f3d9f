"""Routes for throughput profiles: the curves the tuner measured, per device model and workload."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, status

from gpumux.schemas import ProfilePublic, ProfilesPublic
from gpumux.server.api.deps import Offset, ProfileId, ReadSessionDep, get_caller
from gpumux.server.api.responses import AUTHENTICATED, problems
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
