"""What trials report, and the windows of reports and ends the split search measures over."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Literal

from sqlalchemy import func, or_, select, union
from sqlalchemy.orm import InstrumentedAttribute, Session

from gpumux.fields import MAX_SAMPLES
from gpumux.schemas import ReportIn
from gpumux.status import ACTIVE_TRIAL_STATUSES
from gpumux.storage.models import Trial, TrialReport, utcnow
from gpumux.storage.store import token_hash

# Samples/s above what one report may hold per second measure nothing (a near-zero interval).
MAX_RATE = MAX_SAMPLES
# What a report counts, each in a column of its own: a workload is measured in one of them.
Counted = Literal["samples", "steps"]


class ReportRefused(RuntimeError):
    """A report that must not be recorded: wrong token, stale attempt, or a trial not running."""


class TokenMismatch(ReportRefused):
    """A report whose token is not its trial's."""


def add_report(*, session: Session, trial: Trial, token: str, report_in: ReportIn) -> TrialReport:
    """Record a report from the trial's current attempt; refuse anything else."""
    if trial.token_hash is None or token_hash(token) != trial.token_hash:
        raise TokenMismatch(f"trial {trial.id}: the report token does not match")
    if report_in.attempt != trial.attempt:
        raise ReportRefused(
            f"trial {trial.id}: report from attempt {report_in.attempt}, "
            f"the current attempt is {trial.attempt}"
        )
    if trial.status not in ACTIVE_TRIAL_STATUSES:
        raise ReportRefused(f"trial {trial.id} is {trial.status}, not running")
    return _record(
        session=session,
        trial=trial,
        kind=report_in.kind,
        step=report_in.step,
        samples=report_in.samples,
        seconds=report_in.seconds,
        metrics=report_in.metrics,
        steps=report_in.steps,
    )


def add_line_report(
    *,
    session: Session,
    trial: Trial,
    step: int | None,
    samples: float | None,
    metrics: dict[str, float],
) -> TrialReport:
    """Record a GPUMUX_REPORT line that the daemon read in the log of the trial's current attempt.

    Its status is not checked: the last lines of a trial that just ended count too. A line says
    no interval, so it sets no samples/s; its samples still count in the split search's windows.
    """
    return _record(
        session=session,
        trial=trial,
        kind="line",
        step=step,
        samples=samples,
        seconds=None,
        metrics=metrics,
    )


def _record(
    *,
    session: Session,
    trial: Trial,
    kind: str,
    step: int | None,
    samples: float | None,
    seconds: float | None,
    metrics: dict[str, float],
    steps: float | None = None,
) -> TrialReport:
    rate = _rate(samples, seconds)
    steps_rate = _rate(steps, seconds)
    report = TrialReport(
        trial_id=trial.id,
        attempt=trial.attempt,
        kind=kind,
        step=step,
        samples=samples,
        seconds=seconds,
        samples_per_s=rate,
        steps=steps,
        metrics=metrics,
    )
    session.add(report)
    trial.last_report_at = report.at = utcnow()
    if rate is not None:
        trial.samples_per_s = rate
    if steps_rate is not None:
        trial.steps_per_s = steps_rate
    if step is not None:
        trial.step = step
    metric = trial.sweep.objective_metric
    if metric is not None and metric in metrics:
        trial.objective = metrics[metric]
    return report


def _rate(count: float | None, seconds: float | None) -> float | None:
    """`count` per second; None without both, or for an absurd or infinite rate (many in a tiny
    interval): no rate is better than that."""
    rate = count / seconds if count is not None and seconds else None
    return rate if rate is not None and rate <= MAX_RATE else None


def list_reports(
    *, session: Session, trial_id: int, offset: int = 0, limit: int = 1000
) -> tuple[list[TrialReport], int]:
    """A trial's reports in the order they came."""
    where = TrialReport.trial_id == trial_id
    count = session.scalar(select(func.count()).select_from(TrialReport).where(where)) or 0
    page = session.scalars(
        select(TrialReport).where(where).order_by(TrialReport.id).offset(offset).limit(limit)
    )
    return list(page), count


def trials_at_split(
    *, session: Session, device: str, split: int, since: datetime, node_id: int | None = None
) -> list[Trial]:
    """Trials launched on `device` under N=`split` that are active, or ended after `since`;
    with `node_id`, only that node's (and those of no node, from before nodes): another
    node's device of the same key is another device."""
    # A union, not an OR: each side searches its own index (status; end time), where an OR
    # scans every trial that ever ran, each tick of each unsettled search.
    ids = union(
        select(Trial.id).where(Trial.status.in_(ACTIVE_TRIAL_STATUSES)),
        select(Trial.id).where(Trial.ended_at > since),
    )
    query = select(Trial).where(Trial.id.in_(ids), Trial.device == device, Trial.split == split)
    if node_id is not None:
        query = query.where(or_(Trial.node_id == node_id, Trial.node_id.is_(None)))
    found = session.scalars(query.order_by(Trial.id))
    return [trial for trial in found if trial.started_at is not None]


def report_times(
    *,
    session: Session,
    trial_ids: Collection[int],
    start: datetime,
    end: datetime,
    counted: Counted = "samples",
) -> dict[int, list[tuple[datetime, float]]]:
    """When each trial's current attempt reported samples (or steps) in the window (start, end],
    and how many, in order."""
    column = _column(counted)
    rows = session.execute(
        select(TrialReport.trial_id, TrialReport.at, column)
        .join(Trial, Trial.id == TrialReport.trial_id)
        .where(
            TrialReport.trial_id.in_(trial_ids),
            TrialReport.attempt == Trial.attempt,
            column.is_not(None),
            TrialReport.at > start,
            TrialReport.at <= end,
        )
        .order_by(TrialReport.at, TrialReport.id)
    )
    times: dict[int, list[tuple[datetime, float]]] = {}
    for trial_id, at, samples in rows:
        times.setdefault(trial_id, []).append((at, samples or 0.0))
    return times


def samples_of(
    *, session: Session, trial_ids: Collection[int], counted: Counted = "samples"
) -> dict[int, float]:
    """The samples (or steps) each trial's current attempt reported in all."""
    rows = session.execute(
        select(TrialReport.trial_id, func.sum(_column(counted)))
        .join(Trial, Trial.id == TrialReport.trial_id)
        .where(TrialReport.trial_id.in_(trial_ids), TrialReport.attempt == Trial.attempt)
        .group_by(TrialReport.trial_id)
    )
    return {trial_id: float(total or 0.0) for trial_id, total in rows}


def _column(counted: Counted) -> InstrumentedAttribute[float | None]:
    return TrialReport.steps if counted == "steps" else TrialReport.samples
