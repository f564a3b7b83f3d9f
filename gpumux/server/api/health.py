"""Liveness: the daemon answers and its database works."""

from __future__ import annotations

import logging

from fastapi import APIRouter, status
from fastapi.responses import JSONResponse
from sqlalchemy import exc

from gpumux import __version__
from gpumux.schemas.health import Health
from gpumux.server.api.deps import ReadSessionDep, StateDep
from gpumux.server.api.errors import RETRY_AFTER_S, first_line, unreachable
from gpumux.server.api.responses import problem_response, problems
from gpumux.status import ACTIVE_TRIAL_STATUSES, TrialStatus
from gpumux.storage import stats
from gpumux.storage.dialects.base import Dialect

log = logging.getLogger(__name__)

router = APIRouter(tags=["health"])


@router.get(
    "/health",
    response_model=Health,
    responses=problems(status.HTTP_503_SERVICE_UNAVAILABLE),
)
def health(state: StateDep, session: ReadSessionDep) -> Health | JSONResponse:
    """Version, database, devices, and how much work is queued or running; 503 when the
    database cannot be read (locked by another process, its server out of reach, or damaged)."""
    dialect = state.sessions.dialect
    try:
        trials = stats.trials_by_status(session=session)
    except exc.DBAPIError as error:
        reason = first_line(error.orig or error)
        if dialect.is_busy(error):
            log.warning("db %s: health: locked: %s", dialect.label, reason)
            return locked(dialect)
        if dialect.is_unreachable(error):
            # A server away is waited out: restarting the daemon would not bring it back.
            log.warning("db %s: health: unreachable: %s", dialect.label, reason)
            return unreachable(dialect.label, reason)
        log.error("db %s: health: cannot be read: %s", dialect.label, reason)
        return unreadable(dialect, reason)
    return Health(
        status="ok",
        version=__version__,
        database=dialect.label,
        devices=len(state.devices_view()),
        queued_trials=trials[TrialStatus.queued],
        active_trials=sum(trials[active] for active in ACTIVE_TRIAL_STATUSES),
    )


def locked(dialect: Dialect) -> JSONResponse:
    """503 with Retry-After: another process holds the database past the busy timeout."""
    return problem_response(
        status.HTTP_503_SERVICE_UNAVAILABLE,
        f"the database {dialect.label} is locked by another process (waited up to "
        f"{dialect.busy_timeout_s:g} s); try again shortly, and if it lasts, end the process "
        "that holds it",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def unreadable(dialect: Dialect, reason: str) -> JSONResponse:
    """503: the database cannot be read, why, and what to do."""
    return problem_response(
        status.HTTP_503_SERVICE_UNAVAILABLE,
        f"the database {dialect.label} cannot be read ({reason}); stop the daemon and start it "
        "again: a damaged database is then refused with the way to recover it",
    )
