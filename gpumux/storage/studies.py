"""What a node's Optuna study of a sweep reads to keep in step with the database every node
writes: the sweep's trials, the ends of those it holds as running, and new or updated reports.

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
from gpumux.storage.models import Trial, TrialReport


def trial_count(*, session: Session, sweep_id: int) -> int:
    """How many trials the sweep holds, asked by any node."""
    count = select(func.count()).select_from(Trial).where(Trial.sweep_id == sweep_id)
    return session.scalar(count) or 0


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
