"""Reconcile: the database's active trials against the run directories, after a restart."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from sqlalchemy.orm import Session

from gpumux.config import Settings
from gpumux.processes import rundir
from gpumux.processes.rundir import recorded_end, recorded_stop
from gpumux.processes.supervised import SupervisedTrial, kill_leftovers
from gpumux.scheduling import outcomes
from gpumux.scheduling.outcomes import Outcome, StopReason
from gpumux.scheduling.watched import KILL_BACKSTOP_S, Running, Watched
from gpumux.storage import lifecycle
from gpumux.storage import trials as trial_store
from gpumux.storage.models import Trial, utcnow

log = logging.getLogger(__name__)


def run_dir(settings: Settings, trial: Trial) -> Path:
    """Where the supervisor of the trial's current attempt keeps its records."""
    return rundir.attempt_dir(settings.layout.runs, trial.id, trial.attempt)


def stop_reason(run_dir: Path) -> StopReason | None:
    """Why a previous daemon stopped this trial, as its run directory says."""
    reason = recorded_stop(run_dir)
    return StopReason(reason) if reason in set(StopReason) else None


def reconcile(
    *, session: Session, watched: Watched, settings: Settings, node_id: int | None = None
) -> list[tuple[Trial, Outcome]]:
    """Settle every trial of this node (`node_id`; None: every trial) the database calls
    active that `watched` does not hold: record those that ended with their real exit status,
    adopt those whose supervisors live on, requeue the rest within their retry budget. A trial
    written before nodes existed becomes this node's. Returns the ends recorded."""
    recorded = []
    for trial in trial_store.active_trials(session=session, node_id=node_id):
        if trial.id in watched:
            continue
        trial_store.adopt_nodeless(session=session, trial=trial, node_id=node_id)
        directory = run_dir(settings, trial)
        end = recorded_end(directory, trial.attempt)
        if end is None:
            found = SupervisedTrial.find(
                trial_id=trial.id, attempt=trial.attempt, run_dir=directory
            )
            if found is not None:
                adopt(session=session, trial=trial, process=found, watched=watched)
                continue
            # It may have written its exit and gone between the two looks.
            end = recorded_end(directory, trial.attempt)
        if end is None:
            kill_leftovers(trial.id, directory, pgid=trial.pid, started=trial.pid_started)
            outcomes.requeue_or_lose(
                session=session,
                trial=trial,
                why="lost its supervisor while the daemon was away",
                settings=settings,
            )
            continue
        log.info("trial %s: ended while the daemon was away", trial.id)
        outcome = outcomes.record(
            session=session, trial=trial, end=end, stop=stop_reason(directory), settings=settings
        )
        recorded.append((trial, outcome))
    return recorded


def adopt(*, session: Session, trial: Trial, process: SupervisedTrial, watched: Watched) -> None:
    """Watch a supervisor that a previous daemon started, with its time limit and stop intact."""
    log.info("trial %s: adopted (supervisor pid %d)", trial.id, process.pid)
    deadline = None
    if trial.sweep.time_limit_s and trial.started_at is not None:
        elapsed = (utcnow() - trial.started_at).total_seconds()
        deadline = time.monotonic() + trial.sweep.time_limit_s - elapsed
    stop = stop_reason(process.run_dir)
    watched.add(
        trial.id,
        Running(
            process=process,
            sweep_id=trial.sweep_id,
            memory_limit_mb=trial.memory_limit_mb,
            deadline=deadline,
            stop=stop,
            # Its supervisor was told to stop it: step in if it has not within the grace.
            kill_at=time.monotonic() + watched.kill_grace + KILL_BACKSTOP_S
            if stop is not None
            else None,
        ),
    )
    lifecycle.record_adopted(session=session, trial=trial)
