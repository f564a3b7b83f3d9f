"""Liveness: the daemon answers and its database works."""

from __future__ import annotations

from fastapi import APIRouter

from gpumux import __version__
from gpumux.schemas import Health
from gpumux.server.api.deps import ReadSessionDep, StateDep
from gpumux.status import ACTIVE_TRIAL_STATUSES, TrialStatus
from gpumux.storage import stats

router = APIRouter(tags=["health"])


@router.get("/health")
def health(state: StateDep, session: ReadSessionDep) -> Health:
    """Version, database, devices, and how much work is queued or running."""
    trials = stats.trials_by_status(session=session)
    return Health(
        status="ok",
        version=__version__,
        database=state.sessions.dialect.label,
        devices=len(state.devices_view()),
        queued_trials=trials[TrialStatus.queued],
        active_trials=sum(trials[status] for status in ACTIVE_TRIAL_STATUSES),
    )
