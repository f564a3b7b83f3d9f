"""Throughput profiles: the measured curve of each workload on each device model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpumux.storage.models import Profile, utcnow
from gpumux.throughput import CurvePoint, throughput_unit


def get_profile(*, session: Session, device_name: str, fingerprint: str) -> Profile | None:
    """The stored profile of a workload on a device model, if it was measured."""
    return session.scalar(
        select(Profile).where(
            Profile.device_name == device_name, Profile.fingerprint == fingerprint
        )
    )


def similar_profile(
    *,
    session: Session,
    device_name: str,
    command: Sequence[str],
    fingerprint: str,
    workdir: str | None = None,
) -> Profile | None:
    """The most recently updated settled profile of the same command in the same directory (its
    other cost parameters differ) on a device model: where a new workload's search is likeliest
    to end."""
    settled = session.scalars(
        select(Profile)
        .where(
            Profile.device_name == device_name,
            Profile.fingerprint != fingerprint,
            Profile.settled.is_(True),
            Profile.best_split.is_not(None),
        )
        .order_by(Profile.updated_at.desc(), Profile.id.desc())
    )
    # JSON columns compare unreliably in SQL: a device model holds few profiles to scan.
    return next(
        (
            profile
            for profile in settled
            if profile.command == list(command) and profile.workdir == workdir
        ),
        None,
    )


def get_profile_by_id(*, session: Session, profile_id: int) -> Profile | None:
    """One profile by id."""
    return session.get(Profile, profile_id)


def save_profile(
    *,
    session: Session,
    device_name: str,
    fingerprint: str,
    command: Sequence[str],
    param_tokens: Sequence[str],
    unit: str,
    curve: Sequence[Mapping[str, Any]],
    best_split: int | None,
    settled: bool,
    reason: str | None,
    sweep_id: int | None,
    oom_at: int | None = None,
    ceiling: int | None = None,
    workdir: str | None = None,
    context_mb: int | None = None,
) -> Profile:
    """Store the profile of (device model, workload), replacing the one measured before."""
    unit = throughput_unit(unit)
    points = [CurvePoint.from_json(point).to_json() for point in curve]
    now = utcnow()
    profile = get_profile(session=session, device_name=device_name, fingerprint=fingerprint)
    if profile is None:
        profile = Profile(device_name=device_name, fingerprint=fingerprint, created_at=now)
        session.add(profile)
    profile.updated_at = now
    profile.workdir = workdir
    profile.command = list(command)
    profile.param_tokens = list(param_tokens)
    profile.unit = unit
    profile.curve = points
    profile.best_split = best_split
    profile.oom_at = oom_at
    profile.ceiling = ceiling
    if context_mb is not None:
        # The largest measured holds (`gpumux tune` measures none; another node's daemon may
        # have measured more).
        profile.context_mb = max(context_mb, profile.context_mb or 0)
    profile.settled = settled
    profile.reason = reason
    profile.sweep_id = sweep_id
    session.flush()
    return profile


def save_context(*, session: Session, device_name: str, fingerprint: str, context_mb: int) -> None:
    """Keep a CUDA context measured of a workload whose profile is otherwise as stored: the
    largest measured holds."""
    profile = get_profile(session=session, device_name=device_name, fingerprint=fingerprint)
    if profile is not None:
        profile.context_mb = max(context_mb, profile.context_mb or 0)
        profile.updated_at = utcnow()
        session.flush()


def workload_profiles(*, session: Session, fingerprint: str) -> list[Profile]:
    """A workload's profiles, one per device model it was measured on."""
    return list(
        session.scalars(
            select(Profile).where(Profile.fingerprint == fingerprint).order_by(Profile.device_name)
        )
    )


def list_profiles(
    *, session: Session, offset: int = 0, limit: int = 50
) -> tuple[list[Profile], int]:
    """A page of profiles, the most recently updated first, and how many there are."""
    count = session.scalar(select(func.count()).select_from(Profile)) or 0
    page = session.scalars(
        select(Profile)
        .order_by(Profile.updated_at.desc(), Profile.id.desc())
        .offset(offset)
        .limit(limit)
    )
    return list(page), count
