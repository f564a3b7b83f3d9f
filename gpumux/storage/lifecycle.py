"""A trial's status moves, each named for what happened and deciding what the row gets, through
the one gate that changes a trial's status; requeues; the sweep's status derived from its
trials'."""

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
    PruneNote,
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
    memory pool, and where its log was read to) is cleared."""
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
        pool_mb=None,
        pool_at=None,
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


def record_ran(*, session: Session, trial: Trial) -> None:
    """The attempt ended before its start was recorded (a short trial, or a write that failed):
    it did run, so a trial still starting is running first, for its end to follow."""
    if trial.status is TrialStatus.starting:
        set_trial_status(session=session, trial=trial, status=TrialStatus.running)


def record_adopted(*, session: Session, trial: Trial) -> None:
    """A supervisor a previous daemon started is watched again: a trial still starting is
    running, since its launch (since now where that time was lost)."""
    if trial.status is TrialStatus.starting:
        set_trial_status(
            session=session,
            trial=trial,
            status=TrialStatus.running,
            started_at=trial.started_at or utcnow(),
        )


def record_not_started(*, session: Session, trial: Trial, error: str) -> None:
    """The queued or starting trial could not start (its user or its log refused it, its
    supervisor did not spawn): failed before it started, for `error`."""
    if trial.status is TrialStatus.queued:
        set_trial_status(session=session, trial=trial, status=TrialStatus.starting)
    set_trial_status(
        session=session, trial=trial, status=TrialStatus.failed, error=error, ended_at=utcnow()
    )


def record_succeeded(
    *, session: Session, trial: Trial, exit_code: int | None, signal: int | None
) -> None:
    """The attempt's command exited by itself, with code 0."""
    _record_end(
        session=session,
        trial=trial,
        status=TrialStatus.succeeded,
        exit_code=exit_code,
        signal=signal,
    )


def record_cancelled(
    *, session: Session, trial: Trial, exit_code: int | None, signal: int | None
) -> None:
    """The attempt was stopped because its sweep was cancelled."""
    _record_end(
        session=session,
        trial=trial,
        status=TrialStatus.cancelled,
        exit_code=exit_code,
        signal=signal,
    )


def record_pruned(
    *, session: Session, trial: Trial, exit_code: int | None, signal: int | None
) -> None:
    """The attempt was stopped by its sweep's pruner: pruned, for the pruner's note kept when it
    was stopped (`note_pruned`), else for the pruner's name."""
    noted = trial.error if PruneNote.parse(trial.error) is not None else None
    _record_end(
        session=session,
        trial=trial,
        status=TrialStatus.pruned,
        exit_code=exit_code,
        signal=signal,
        error=noted or f"pruned by the {trial.sweep.prune} pruner",
    )


def record_timed_out(
    *, session: Session, trial: Trial, exit_code: int | None, signal: int | None
) -> None:
    """The attempt was stopped at its sweep's time limit: failed, saying so."""
    limit = trial.sweep.time_limit_s
    _record_end(
        session=session,
        trial=trial,
        status=TrialStatus.failed,
        exit_code=exit_code,
        signal=signal,
        error=f"time limit of {limit:g} s exceeded; stopped",
    )


def record_failed(
    *,
    session: Session,
    trial: Trial,
    error: str,
    exit_code: int | None = None,
    signal: int | None = None,
) -> None:
    """The attempt failed, for `error`, with its exit status (none where its command never
    started)."""
    _record_end(
        session=session,
        trial=trial,
        status=TrialStatus.failed,
        exit_code=exit_code,
        signal=signal,
        error=error,
    )


def _record_end(
    *,
    session: Session,
    trial: Trial,
    status: TrialStatus,
    exit_code: int | None,
    signal: int | None,
    error: str | None = None,
) -> None:
    """The attempt ended in `status` now, with its exit status; `error` replaces the trial's
    error where given (a success or a cancel keeps what an earlier attempt's requeue said)."""
    fields: dict[str, Any] = {"exit_code": exit_code, "signal": signal, "ended_at": utcnow()}
    if error is not None:
        fields["error"] = error
    set_trial_status(session=session, trial=trial, status=status, **fields)


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
