"""Routes for trials: one trial, its log, its reports."""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from sqlalchemy.orm import Session

from gpumux.processes.supervisor import log_base_path
from gpumux.schemas import LogChunk, ReportPublic, ReportsPublic, TrialPublic
from gpumux.server.api.deps import Caller, CallerDep, ReadSessionDep, refuse_unless_owner
from gpumux.storage import store
from gpumux.storage.models import Trial

router = APIRouter(tags=["trials"])

LOG_TAIL_BYTES = 16 * 1024
LOG_CHUNK_MAX = 1024 * 1024
# The rotated pieces of a log looked for (GPUMUX_LOG_KEEP beyond this are not served).
MAX_PIECES = 9


def trial_or_404(session: Session, trial_id: int, caller: Caller) -> Trial:
    """The trial, if it exists (404) and the caller may touch its sweep (403)."""
    trial = store.get_trial(session=session, trial_id=trial_id)
    if trial is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"trial {trial_id} not found")
    refuse_unless_owner(caller, trial.sweep.owner.name, f"trial {trial_id}")
    return trial


@router.get("/trials/{trial_id}")
def get_trial(trial_id: int, session: ReadSessionDep, caller: CallerDep) -> TrialPublic:
    """One trial; a failed one carries its exit status and the last lines of its log."""
    return TrialPublic.model_validate(trial_or_404(session, trial_id, caller))


@router.get("/trials/{trial_id}/log")
def get_trial_log(
    trial_id: int,
    session: ReadSessionDep,
    caller: CallerDep,
    offset: Annotated[int | None, Query(ge=0, description="byte offset; omit for the tail")] = None,
    limit: Annotated[int, Query(ge=1, le=LOG_CHUNK_MAX)] = 256 * 1024,
) -> LogChunk:
    """The trial's log from `offset`, or its tail; follow it with `next_offset`."""
    trial = trial_or_404(session, trial_id, caller)
    raw, start, size, skipped = b"", 0, 0, 0
    if trial.log_path is not None:
        try:
            raw, start, size, skipped = read_log(Path(trial.log_path), offset, limit)
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
        skipped=skipped,
        data=data,
        complete=trial.status.is_final and next_offset >= size,
    )


def read_log(path: Path, offset: int | None, limit: int) -> tuple[bytes, int, int, int]:
    """Up to `limit` bytes of a log from `offset` (None: its tail), reading the rotated
    pieces where the offset falls in one: (data, where it starts, the log's size, bytes
    after `offset` that rotation dropped). Offsets count the whole output."""
    pieces = [path, *(path.with_name(f"{path.name}.{n}") for n in range(1, MAX_PIECES + 1))]
    sizes: list[int] = []
    for piece in pieces:
        try:
            sizes.append(piece.stat().st_size)
        except FileNotFoundError:
            if piece != path:
                break
            # Caught in a rotation's renames (or no log yet): nothing now, nothing lost; a
            # follower asks again from where it is.
            return b"", offset or 0, offset or 0, 0
    starts = [_log_base(path)]
    for piece_size in sizes[1:]:
        starts.append(starts[-1] - piece_size)
    size = starts[0] + sizes[0]
    if offset is None:
        offset = max(starts[0], size - LOG_TAIL_BYTES)
    skipped = max(0, starts[-1] - offset)
    offset = min(max(offset, starts[-1]), size)
    index = next(n for n, piece_start in enumerate(starts) if piece_start <= offset)
    try:
        with open(pieces[index], "rb") as log_file:
            log_file.seek(offset - starts[index])
            return log_file.read(limit), offset, size, skipped
    except FileNotFoundError:
        # Rotated between the look and the read: nothing this time, the next ask finds it.
        return b"", offset, size, skipped


def _log_base(path: Path) -> int:
    try:
        record = json.loads(Path(log_base_path(path)).read_text())
    except (OSError, ValueError):
        return 0
    base = record.get("base") if isinstance(record, dict) else None
    return base if isinstance(base, int) else 0


@router.get("/trials/{trial_id}/reports")
def list_trial_reports(
    trial_id: int,
    session: ReadSessionDep,
    caller: CallerDep,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> ReportsPublic:
    """What the trial reported over time: samples/s and metrics."""
    trial_or_404(session, trial_id, caller)
    reports, count = store.list_reports(
        session=session, trial_id=trial_id, offset=offset, limit=limit
    )
    return ReportsPublic(data=[ReportPublic.model_validate(r) for r in reports], count=count)
