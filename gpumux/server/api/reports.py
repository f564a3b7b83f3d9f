"""The route trials report to, authorised by the per-trial token."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Response, status

from gpumux.schemas.reports import ReportIn
from gpumux.server import identity
from gpumux.server.api.deps import StateDep
from gpumux.server.api.responses import AUTHENTICATED, WRITES, problems
from gpumux.storage import reports as report_store
from gpumux.storage import trials as trial_store

router = APIRouter(tags=["reports"])


@router.post(
    "/reports",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=problems(*AUTHENTICATED, 404, 409, 422, *WRITES),
)
def post_report(
    report_in: ReportIn,
    state: StateDep,
    authorization: Annotated[str | None, Header()] = None,
) -> Response:
    """Record a running trial's throughput and metrics (Authorization: Bearer <trial token>)."""
    token = identity.credentials(authorization, "Bearer")
    if token is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "reports need 'Authorization: Bearer <GPUMUX_TRIAL_TOKEN>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    with state.sessions.write.begin() as session:
        trial = trial_store.get_trial(session=session, trial_id=report_in.trial_id)
        if trial is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"trial {report_in.trial_id} not found")
        try:
            report_store.add_report(
                session=session,
                trial=trial,
                token=token,
                report_in=report_in,
                budget=state.budget,
            )
        except report_store.TokenMismatch as error:
            raise HTTPException(status.HTTP_403_FORBIDDEN, str(error)) from error
        except report_store.ReportRefused as error:
            raise HTTPException(status.HTTP_409_CONFLICT, str(error)) from error
    return Response(status_code=status.HTTP_204_NO_CONTENT)
