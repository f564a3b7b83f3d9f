"""What a node's Optuna study of a sweep reads to keep in step with the database every node
writes (the sweep's trials, the ends of those it holds as running, new or updated reports), and
what it writes: the trials its sampler asks, the sampler's and pruner's state beside them.

No read here trusts an order of ids or clocks across trials and nodes: a report's id is
taken before its transaction commits (a concurrent one may commit a lower id later), a row of
one step is updated in place as later reports of that step merge into it
(storage/budget.py), and each node stamps the ends it records with its own clock. A study
compares what it holds with what is stored instead.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpumux.status import ACTIVE_TRIAL_STATUSES, FINAL_TRIAL_STATUSES
from gpumux.storage.backlog import asked_count
from gpumux.storage.models import Sweep, Trial, TrialReport, utcnow


def trials_of(*, session: Session, sweep_id: int) -> list[Trial]:
    """The sweep's trials in their order, asked by any node."""
    found = session.scalars(select(Trial).where(Trial.sweep_id == sweep_id).order_by(Trial.number))
    return list(found)


def add_asked(
    *,
    session: Session,
    sweep: Sweep,
    params: dict[str, Any],
    optuna_attrs: dict[str, Any],
    study_attrs: dict[str, Any],
) -> Trial:
    """The trial the sweep's sampler asked, stored queued after its last one in the caller's
    transaction, with what the sampler keeps of it and of the study."""
    last = session.scalar(select(func.max(Trial.number)).where(Trial.sweep_id == sweep.id))
    trial = Trial(
        sweep_id=sweep.id,
        number=0 if last is None else last + 1,
        params=params,
        queued_at=utcnow(),
        optuna_attrs=optuna_attrs,
    )
    session.add(trial)
    session.flush()
    sweep.study_attrs = study_attrs
    return trial


def end_budget(*, session: Session, sweep: Sweep) -> None:
    """An adaptive sweep asks no more: its budget becomes the trials it asked."""
    sweep.trial_count = asked_count(session=session, sweep=sweep)


def drop_pruner(*, sweep: Sweep) -> None:
    """The sweep runs on without its pruner (which failed)."""
    sweep.prune = None


def keep_pruner_state(*, trial: Trial, optuna_attrs: dict[str, Any]) -> None:
    """What the pruner keeps of a trial (an ASHA rung), stored for a rebuilt study."""
    trial.optuna_attrs = optuna_attrs


class Running(NamedTuple):
    """A starting or running trial: its current attempt, and when it last reported (every
    report's transaction sets it, so a new value says its rows changed)."""

    attempt: int
    last_report_at: datetime | None


def running_trials(*, session: Session, sweep_id: int) -> dict[int, Running]:
    """The sweep's starting and running trials by id."""
    rows = session.execute(
        select(Trial.id, Trial.attempt, Trial.last_report_at).where(
            Trial.sweep_id == sweep_id, Trial.status.in_(ACTIVE_TRIAL_STATUSES)
        )
    )
    return {trial_id: Running(attempt, at) for trial_id, attempt, at in rows}


def ended_among(*, session: Session, trial_ids: Collection[int]) -> list[Trial]:
    """Those of these trials that have ended, whichever node recorded it and whenever."""
    if not trial_ids:
        return []
    found = session.scalars(
        select(Trial)
        .where(Trial.id.in_(list(trial_ids)), Trial.status.in_(FINAL_TRIAL_STATUSES))
        .order_by(Trial.id)
    )
    return list(found)


class StepReport(NamedTuple):
    """What the pruner reads of one report row."""

    trial_id: int
    id: int
    step: int
    metrics: dict[str, Any]


def reports_from(*, session: Session, marks: Mapping[int, int]) -> list[StepReport]:
    """The step reports of these running trials' current attempts from each trial's mark on,
    the row at the mark included (later reports of its step may have merged into it), in the
    order each trial stored them.

    Only one trial's rows are taken to commit in the order of their ids: its reports are
    written in write transactions, which run one at a time (storage/dialects/), and each of
    its rows takes its id inside one. Another trial's rows may land with lower ids.
    """
    if not marks:
        return []
    # One range from the lowest mark, each trial's own applied here: a condition per trial
    # costs more to build each pass than the few rows the range adds (only trials that
    # reported since the last look are asked for).
    rows = session.execute(
        select(TrialReport.trial_id, TrialReport.id, TrialReport.step, TrialReport.metrics)
        .join(Trial, Trial.id == TrialReport.trial_id)
        .where(
            TrialReport.trial_id.in_(list(marks)),
            TrialReport.id >= min(marks.values()),
            Trial.status.in_(ACTIVE_TRIAL_STATUSES),
            TrialReport.attempt == Trial.attempt,
            TrialReport.step.is_not(None),
        )
        .order_by(TrialReport.trial_id, TrialReport.id)
    )
    return [StepReport(*row) for row in rows if row.id >= marks[row.trial_id]]


def trials_by_id(*, session: Session, trial_ids: Collection[int]) -> dict[int, Trial]:
    """These trials, in one query."""
    if not trial_ids:
        return {}
    found = session.scalars(select(Trial).where(Trial.id.in_(list(trial_ids))))
    return {trial.id: trial for trial in found}


def step_reports(
    *, session: Session, trials: Collection[Trial]
) -> dict[int, list[tuple[int, dict[str, Any]]]]:
    """Per trial, the (step, metrics) of each report with a step that its current attempt
    made, in the order stored."""
    attempts = {trial.id: trial.attempt for trial in trials}
    if not attempts:
        return {}
    rows = session.execute(
        select(TrialReport.trial_id, TrialReport.attempt, TrialReport.step, TrialReport.metrics)
        .where(TrialReport.trial_id.in_(list(attempts)), TrialReport.step.is_not(None))
        .order_by(TrialReport.id)
    )
    by_trial: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    for trial_id, attempt, step, metrics in rows:
        if attempt == attempts[trial_id]:
            by_trial.setdefault(trial_id, []).append((step, metrics))
    return by_trial
