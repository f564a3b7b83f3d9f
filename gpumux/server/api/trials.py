"""Routes for trials: one trial, its log, its reports."""

from __future__ import annotations

import codecs
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from sqlalchemy.orm import Session

from gpumux.fields import MAX_ID
from gpumux.processes.logfiles import read_log
from gpumux.schemas.reports import ReportPublic, ReportsPublic
from gpumux.schemas.trials import LogChunk, TrialPublic
from gpumux.server.api import forward
from gpumux.server.api.deps import (
    Caller,
    CallerDep,
    Offset,
    ReadSessionDep,
    StateDep,
    TrialId,
    refuse_unless_owner,
)
from gpumux.server.api.responses import AUTHENTICATED, problems
from gpumux.storage import nodes
from gpumux.storage import reports as report_store
from gpumux.storage import trials as trial_store
from gpumux.storage.models import Trial

router = APIRouter(tags=["trials"], responses=problems(*AUTHENTICATED, 404, 422))

LOG_CHUNK_MAX = 1024 * 1024


def trial_or_404(session: Session, trial_id: int, caller: Caller) -> Trial:
    """The trial, if it exists (404) and the caller may touch its sweep (403)."""
    trial = trial_store.get_trial(session=session, trial_id=trial_id)
    if trial is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"trial {trial_id} not found")
    refuse_unless_owner(caller, trial.sweep.owner.name, f"trial {trial_id}")
    return trial


@router.get("/trials/{trial_id}")
def get_trial(trial_id: TrialId, session: ReadSessionDep, caller: CallerDep) -> TrialPublic:
    """One trial; a failed one carries its exit status and the last lines of its log."""
    return TrialPublic.model_validate(trial_or_404(session, trial_id, caller))


LogOffset = Annotated[
    int | None, Query(ge=0, le=MAX_ID, description="byte offset; omit for the tail")
]
LogLimit = Annotated[int, Query(ge=1, le=LOG_CHUNK_MAX)]


@router.get("/trials/{trial_id}/log", responses=problems(502, 503))
def get_trial_log(
    trial_id: TrialId,
    state: StateDep,
    session: ReadSessionDep,
    caller: CallerDep,
    offset: LogOffset = None,
    limit: LogLimit = 256 * 1024,
) -> LogChunk:
    """The trial's log from `offset`, or its tail; follow it with `next_offset`.

    A trial on another node has its log there: this node asks that one for it.
    """
    trial = trial_or_404(session, trial_id, caller)
    here = state.node
    if here is not None and trial.node_id is not None and trial.node_id != here.id:
        holder = nodes.get_node(session=session, node_id=trial.node_id)
        return forward.trial_log(
            node_client=state.node_client,
            asker=here,
            holder=holder,
            trial=trial,
            offset=offset,
            limit=limit,
        )
    return log_chunk(trial, offset, limit)


def log_chunk(trial: Trial, offset: int | None, limit: int) -> LogChunk:
    """The trial's log from `offset` (None: its tail), read from this node's disk."""
    raw, start, size, skipped = b"", 0, 0, 0
    if trial.log_path is not None:
        try:
            raw, start, size, skipped = read_log(trial.log_path, offset, limit)
        except OSError as error:
            raise HTTPException(
                status.HTTP_500_INTERNAL_SERVER_ERROR,
                f"trial {trial.id}: cannot read its log {trial.log_path}: {error.strerror}",
            ) from error
    # A chunk may end inside a multi-byte character: hold those bytes back for the next call.
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    data = decoder.decode(raw, final=False)
    next_offset = start + len(raw) - len(decoder.getstate()[0])
    return LogChunk(
        trial_id=trial.id,
        attempt=trial.attempt,
        offset=start,
        next_offset=next_offset,
        size=size,
        skipped=skipped,
        data=data,
        complete=trial.status.is_final and next_offset >= size,
    )


@router.get("/trials/{trial_id}/reports")
def list_trial_reports(
    trial_id: TrialId,
    session: ReadSessionDep,
    caller: CallerDep,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> ReportsPublic:
    """What the trial reported over time: samples/s and metrics."""
    trial_or_404(session, trial_id, caller)
    reports, count = report_store.list_reports(
        session=session, trial_id=trial_id, offset=offset, limit=limit
    )
    return ReportsPublic(data=[ReportPublic.model_validate(r) for r in reports], count=count)
