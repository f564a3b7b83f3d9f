"""How the end of a trial process is recorded: its status, its error, and whether it runs again."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy.orm import Session

from gpumux.config import Settings
from gpumux.processes.logfiles import tail_lines
from gpumux.processes.rundir import ExitStatus, TrialEnd
from gpumux.splits.out_of_memory import is_out_of_memory
from gpumux.status import TrialStatus
from gpumux.storage import lifecycle
from gpumux.storage import trials as trial_store
from gpumux.storage.models import Trial

log = logging.getLogger(__name__)


class StopReason(StrEnum):
    """Why gpumux itself stopped a trial."""

    cancel = "cancel"
    timeout = "timeout"
    shutdown = "shutdown"
    # The sweep's pruner stopped it at a report.
    prune = "prune"
    # Its supervisor stopped it: the node's lease on a shared database lapsed unrenewed.
    lease = "lease"


@dataclass(frozen=True)
class Outcome:
    """What became of a trial whose process ended, for the loop to pass on."""

    status: TrialStatus
    # An auto-split trial ran out of device memory at its N: its workload's N must come down.
    out_of_memory: bool = False


def may_record(trial: Trial, *, attempt: int, node_id: int | None, what: str) -> bool:
    """Whether node `node_id` (None: the only scheduler) may still record `what` of the trial's
    `attempt`. Fencing: an older attempt's news never overwrites a newer one, nor one another
    node runs."""
    refused = trial_store.still_held(trial, node_id=node_id, attempt=attempt)
    if refused is not None:
        log.warning("trial %s: refusing %s of attempt %d (%s)", trial.id, what, attempt, refused)
    return refused is None


def record(
    *, session: Session, trial: Trial, end: TrialEnd, stop: StopReason | None, settings: Settings
) -> Outcome:
    """Record how an attempt ended, as its supervisor wrote it, given why gpumux stopped it
    (None: it ended by itself)."""
    if stop is None and trial.sweep.cancel_requested:
        stop = StopReason.cancel
    lifecycle.record_ran(session=session, trial=trial)
    if end.error is not None and stop is None:
        lifecycle.record_failed(session=session, trial=trial, error=end.error)
        outcome = Outcome(status=trial.status)
    else:
        outcome = record_exit(
            session=session, trial=trial, exit_status=end.exit_status, stop=stop, settings=settings
        )
    log.info("trial %s: %s -> %s", trial.id, end.exit_status.describe(), trial.status)
    return outcome


def record_exit(
    *,
    session: Session,
    trial: Trial,
    exit_status: ExitStatus,
    stop: StopReason | None,
    settings: Settings,
) -> Outcome:
    """Record how a trial's process exited, given why gpumux stopped it (None: by itself)."""
    code, killed_by = exit_status
    if stop is StopReason.shutdown:
        requeue_or_lose(
            session=session, trial=trial, why="stopped by a daemon shutdown", settings=settings
        )
    elif stop is StopReason.lease:
        requeue_or_lose(
            session=session,
            trial=trial,
            why="stopped: its node's lease lapsed (the daemon did not renew it in time)",
            settings=settings,
        )
    elif stop is StopReason.cancel:
        lifecycle.record_cancelled(session=session, trial=trial, exit_code=code, signal=killed_by)
    elif stop is StopReason.prune:
        # The pruner's decision, noted when the trial was stopped (SweepStops.apply_pruners).
        lifecycle.record_pruned(session=session, trial=trial, exit_code=code, signal=killed_by)
    elif stop is StopReason.timeout:
        lifecycle.record_timed_out(session=session, trial=trial, exit_code=code, signal=killed_by)
    elif code == 0:
        lifecycle.record_succeeded(session=session, trial=trial, exit_code=code, signal=killed_by)
    else:
        return _record_failure(
            session=session, trial=trial, exit_status=exit_status, settings=settings
        )
    return Outcome(status=trial.status)


def _record_failure(
    *,
    session: Session,
    trial: Trial,
    exit_status: ExitStatus,
    settings: Settings,
) -> Outcome:
    how = exit_status.describe()
    tail = tail_lines(trial.log_path, settings.log_tail_lines)
    if is_out_of_memory(tail):
        if trial.sweep.split is None and trial.attempt <= settings.oom_retries:
            # The split search went one N too far: it lowers N, and the trial runs again.
            lifecycle.requeue(
                session=session,
                trial=trial,
                why=f"ran out of device memory at N={trial.split}",
                then="requeued at a lower N",
            )
            return Outcome(status=trial.status, out_of_memory=True)
        if trial.sweep.split is None:
            how = (
                f"out of device memory on each of {trial.attempt} attempts, the last at "
                f"N={trial.split} ({how}); it needs more than a slice of this device at "
                f"N={trial.split} holds: "
                "lower its memory use (batch size, model), run it with --split 1, or raise "
                "GPUMUX_OOM_RETRIES for more tries at lower N"
            )
        else:
            how = f"out of device memory at N={trial.split} ({how}); try a smaller --split"
    elif trial.failures < trial.sweep.retries:
        lifecycle.requeue(
            session=session,
            trial=trial,
            why=how,
            then=f"retry {trial.failures + 1} of {trial.sweep.retries}",
            failures=trial.failures + 1,
        )
        return Outcome(status=trial.status)
    lifecycle.record_failed(
        session=session,
        trial=trial,
        error=f"{how}; last lines of its log:\n{tail}",
        exit_code=exit_status.exit_code,
        signal=exit_status.signal,
    )
    return Outcome(status=trial.status)


def requeue_or_lose(*, session: Session, trial: Trial, why: str, settings: Settings) -> None:
    """Run a trial cut off by gpumux again, within its retry budget; else record it lost."""
    lifecycle.requeue_or_lose(
        session=session, trial=trial, why=why, lost_retries=settings.lost_retries
    )
