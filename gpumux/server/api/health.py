"""Liveness: the daemon answers and its database works."""

from __future__ import annotations

import logging

from fastapi import APIRouter, status
from fastapi.responses import JSONResponse
from sqlalchemy import exc

from gpumux import __version__
from gpumux.schemas import Health
from gpumux.server.api.deps import ReadSessionDep, StateDep
from gpumux.server.api.responses import problem_response, problems
from gpumux.status import ACTIVE_TRIAL_STATUSES, TrialStatus
from gpumux.storage import stats

log = logging.getLogger(__name__)

router = APIRouter(tags=["health"])


@router.get(
    "/health",
    response_model=Health,
    responses=problems(status.HTTP_503_SERVICE_UNAVAILABLE),
)
def health(state: StateDep, session: ReadSessionDep) -> Health | JSONResponse:
    """Version, database, devices, and how much work is queued or running; 503 when the
    database cannot be read."""
    database = state.sessions.dialect.label
    try:
        trials = stats.trials_by_status(session=session)
    except exc.DBAPIError as error:
        log.error("db %s: health: cannot be read: %s", database, error.orig)
        return unreadable(database, error)
    return Health(
        status="ok",
        version=__version__,
        database=database,
        devices=len(state.devices_view()),
        queued_trials=trials[TrialStatus.queued],
        active_trials=sum(trials[active] for active in ACTIVE_TRIAL_STATUSES),
    )


def unreadable(database: str, error: exc.DBAPIError) -> JSONResponse:
    """503: the database cannot be read, why, and what to do."""
    reason = (str(error.orig).splitlines() or [type(error.orig).__name__])[0]
    return problem_response(
        status.HTTP_503_SERVICE_UNAVAILABLE,
        f"the database {database} cannot be read ({reason}); stop the daemon and start it "
        "again: a damaged database is then refused with the way to recover it",
    )
