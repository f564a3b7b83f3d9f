"""Routes for trials: one trial, its log, its reports."""

from __future__ import annotations

import codecs
import os
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from sqlalchemy.orm import Session

from gpumux import store
from gpumux.api.deps import ReadSessionDep
from gpumux.models import Trial
from gpumux.schemas import LogChunk, ReportPublic, ReportsPublic, TrialPublic

router = APIRouter(tags=["trials"])

LOG_TAIL_BYTES = 16 * 1024
LOG_CHUNK_MAX = 1024 * 1024


def trial_or_404(session: Session, trial_id: int) -> Trial:
    trial = store.get_trial(session=session, trial_id=trial_id)
    if trial is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"trial {trial_id} not found")
    return trial


@router.get("/trials/{trial_id}")
def get_trial(trial_id: int, session: ReadSessionDep) -> TrialPublic:
    """One trial; a failed one carries its exit status and the last lines of its log."""
    return TrialPublic.model_validate(trial_or_404(session, trial_id))


@router.get("/trials/{trial_id}/log")
def get_trial_log(
    trial_id: int,
    session: ReadSessionDep,
    offset: Annotated[int | None, Query(ge=0, description="byte offset; omit for the tail")] = None,
    limit: Annotated[int, Query(ge=1, le=LOG_CHUNK_MAX)] = 256 * 1024,
) -> LogChunk:
    """The trial's log from `offset`, or its tail; follow it with `next_offset`."""
    trial = trial_or_404(session, trial_id)
    raw, start, size = b"", 0, 0
    if trial.log_path is not None:
        try:
            with open(trial.log_path, "rb") as log_file:
                size = os.fstat(log_file.fileno()).st_size
                start = max(0, size - LOG_TAIL_BYTES) if offset is None else min(offset, size)
                log_file.seek(start)
                raw = log_file.read(limit)
        except FileNotFoundError:
            pass
        except OSError as error:
            raise HTTPException(
                status.HTTP_500_INTERNAL_SERVER_ERROR,
                f"trial {trial_id}: cannot read its log {trial.log_path}: {error.strerror}",
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
        data=data,
        complete=trial.status.is_final and next_offset >= size,
    )


@router.get("/trials/{trial_id}/reports")
def list_trial_reports(
    trial_id: int,
    session: ReadSessionDep,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> ReportsPublic:
    """What the trial reported over time: samples/s and metrics."""
    trial_or_404(session, trial_id)
    reports, count = store.list_reports(
        session=session, trial_id=trial_id, offset=offset, limit=limit
    )
    return ReportsPublic(data=[ReportPublic.model_validate(r) for r in reports], count=count)
