"""The gate that changes a trial's status, the sweep's status derived from its trials', and
requeues."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy import CursorResult, update
from sqlalchemy.orm import Session

from gpumux.status import (
    ACTIVE_TRIAL_STATUSES,
    FINAL_TRIAL_STATUSES,
    TRIAL_TRANSITIONS,
    SweepStatus,
    TrialStatus,
)
from gpumux.storage import sweeps as sweep_store
from gpumux.storage.models import Sweep, Trial, token_hash, utcnow

log = logging.getLogger(__name__)


class IllegalTransition(RuntimeError):
    """A trial status change that the lifecycle does not allow."""


def set_trial_status(
    *, session: Session, trial: Trial, status: TrialStatus, **fields: Any
) -> Trial:
    """Move a trial to `status` (setting `fields` with it) if the lifecycle allows the move."""
    if status not in TRIAL_TRANSITIONS[trial.status]:
        raise IllegalTransition(f"trial {trial.id}: {trial.status} -> {status} is not allowed")
    for name, value in fields.items():
        if not hasattr(Trial, name):
            raise AttributeError(f"Trial has no field {name!r}")
        setattr(trial, name, value)
    log.debug("trial %s: %s -> %s", trial.id, trial.status, status)
    trial.status = status
    session.flush()
    refresh_sweep_status(session=session, sweep=trial.sweep)
    return trial


def record_launch(
    *,
    session: Session,
    trial: Trial,
    node_id: int | None,
    device: str,
    slot: int,
    split: int,
    memory_limit_mb: int | None,
    cpu_threads: int | None,
    token: str,
    log_path: str,
) -> None:
    """The trial's attempt is launched on node `node_id` (None: the only scheduler) in `slot`
    of `device` at `split`, with its cap, its report token (kept as its hash) and its log: it
    is starting, and what an earlier attempt left (its step, objective, exit, process group,
    and where its log was read to) is cleared."""
    set_trial_status(
        session=session,
        trial=trial,
        status=TrialStatus.starting,
        node_id=node_id,
        device=device,
        slot=slot,
        split=split,
        memory_limit_mb=memory_limit_mb,
        cpu_threads=cpu_threads,
        token_hash=token_hash(token),
        log_path=log_path,
        log_scanned=0,
        step=None,
        objective=None,
        exit_code=None,
        signal=None,
        pid=None,
        pid_started=None,
        started_at=utcnow(),
    )


def record_started(*, session: Session, trial: Trial, pid: int, pid_started: int | None) -> None:
    """The trial's command started, as process group `pid` (whose leader started at ticks
    `pid_started`, None if unknown): the trial is running, and a later daemon finds its
    processes by these."""
    if trial.status is TrialStatus.starting:
        set_trial_status(session=session, trial=trial, status=TrialStatus.running)
    trial.pid, trial.pid_started = pid, pid_started


def note_pruned(*, session: Session, trial: Trial, note: str) -> None:
    """The pruner stops the running trial, for `note` (a `PruneNote`): kept as its error now,
    for its end to carry into the pruned status (the trial reports on until the signal lands)."""
    trial.error = note


def refresh_sweep_status(*, session: Session, sweep: Sweep, now: datetime | None = None) -> None:
    """Derive a sweep's status from its trials' (called after every trial transition)."""
    counts = sweep_store.trial_counts(session=session, sweep_ids=[sweep.id])[sweep.id]
    final = sum(count for status, count in counts.items() if status in FINAL_TRIAL_STATUSES)
    unfinished = counts.get(TrialStatus.queued, 0) + sum(
        counts.get(status, 0) for status in ACTIVE_TRIAL_STATUSES
    )
    # A cancelled adaptive sweep ends with the trials it asked, short of its budget.
    if final >= sweep.trial_count or (sweep.cancel_requested and not unfinished):
        status = SweepStatus.cancelled if sweep.cancel_requested else SweepStatus.finished
        if sweep.finished_at is None:
            sweep.finished_at = now or utcnow()
    elif final or any(counts.get(status) for status in ACTIVE_TRIAL_STATUSES):
        status = SweepStatus.running
    else:
        status = SweepStatus.queued
    if status != sweep.status:
        log.info("sweep %s: %s -> %s", sweep.id, sweep.status, status)
        sweep.status = status


def cancel_queued_trials(*, session: Session, sweep: Sweep) -> int:
    """Cancel all of a sweep's queued trials in one statement; returns how many."""
    if TrialStatus.cancelled not in TRIAL_TRANSITIONS[TrialStatus.queued]:
        raise IllegalTransition("queued -> cancelled is not allowed")
    result: CursorResult[Any] = session.execute(  # type: ignore[assignment]
        update(Trial)
        .where(Trial.sweep_id == sweep.id, Trial.status == TrialStatus.queued)
        .values(status=TrialStatus.cancelled, ended_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    session.expire_all()
    refresh_sweep_status(session=session, sweep=sweep)
    return result.rowcount


def requeue_or_lose(*, session: Session, trial: Trial, why: str, lost_retries: int) -> None:
    """Run a trial cut off by gpumux (or by its node's end) again, within its retry budget;
    else record it lost."""
    if trial.attempt <= lost_retries:
        requeue(session=session, trial=trial, why=why, then="requeued")
    else:
        set_trial_status(
            session=session,
            trial=trial,
            status=TrialStatus.lost,
            error=f"attempt {trial.attempt} {why}; no retries left",
            ended_at=utcnow(),
        )


def requeue(
    *, session: Session, trial: Trial, why: str, then: str, failures: int | None = None
) -> None:
    """Queue a trial for its next attempt, on whichever node claims it, noting what happened
    to this one."""
    set_trial_status(
        session=session,
        trial=trial,
        status=TrialStatus.queued,
        attempt=trial.attempt + 1,
        failures=trial.failures if failures is None else failures,
        error=f"attempt {trial.attempt} {why}; {then}",
        queued_at=utcnow(),
        pid=None,
        log_path=None,
        node_id=None,
    )
