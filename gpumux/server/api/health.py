"""Liveness: the daemon answers and its database works."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import func, select

from gpumux import __version__
from gpumux.schemas import Health
from gpumux.server.api.deps import ReadSessionDep, StateDep
from gpumux.status import TrialStatus
from gpumux.storage import store
from gpumux.storage.models import Trial

router = APIRouter(tags=["health"])


@router.get("/health")
def health(state: StateDep, session: ReadSessionDep) -> Health:
    """Version, database, devices, and how much work is queued or running."""
    queued = session.scalar(
        select(func.count()).select_from(Trial).where(Trial.status == TrialStatus.queued)
    )
    return Health(
        status="ok",
        version=__version__,
        database=state.sessions.dialect.label,
        devices=len(state.devices_view()),
        queued_trials=queued or 0,
        active_trials=len(store.active_trials(session=session)),
    )
