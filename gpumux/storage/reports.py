"""What trials report, and the windows of reports and ends the split search measures over."""

from __future__ import annotations

import logging
import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, Protocol

from sqlalchemy import ColumnElement, case, func, or_, select, union
from sqlalchemy.orm import InstrumentedAttribute, Session

from gpumux.fields import MAX_SAMPLES
from gpumux.status import ACTIVE_TRIAL_STATUSES, TrialStatus
from gpumux.storage.budget import ReportBudget, Seed, Verdict
from gpumux.storage.models import Trial, TrialReport, token_hash, utcnow

log = logging.getLogger(__name__)

# The trials whose totals are what one trial of a sweep does: those that ran to their end, and
# those its pruner stopped (in a pruned sweep, most of them).
ENDED_WORK = (TrialStatus.succeeded, TrialStatus.pruned)
# Samples/s above what one report may hold per second measure nothing (a near-zero interval).
MAX_RATE = MAX_SAMPLES
# What a report counts, each in a column of its own: a workload is measured in one of them.
Counted = Literal["samples", "steps"]


class ReportRefused(RuntimeError):
    """A report that must not be recorded: wrong token, stale attempt, or a trial not running."""


class TokenMismatch(ReportRefused):
    """A report whose token is not its trial's."""


@dataclass(frozen=True, slots=True)
class Incoming:
    """One report to record, or `count` consecutive reports of one step merged (their samples
    and steps summed, each metric's and the pool's last value)."""

    step: int | None
    samples: float | None
    metrics: dict[str, float]
    seconds: float | None = None
    steps: float | None = None
    count: int = 1
    pool_mb: int | None = None
    # When the pool was read, if known to be earlier than the report's arrival.
    pool_at: datetime | None = None


class Report(Protocol):
    """A report as the API took it (its ReportIn): the fields storage reads."""

    @property
    def attempt(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def step(self) -> int | None: ...
    @property
    def samples(self) -> float | None: ...
    @property
    def seconds(self) -> float | None: ...
    @property
    def steps(self) -> float | None: ...
    @property
    def no_gpu(self) -> str | None: ...
    @property
    def pool_mb(self) -> int | None: ...
    @property
    def pool_at(self) -> float | None: ...
    @property
    def metrics(self) -> dict[str, float]: ...


def add_report(
    *, session: Session, trial: Trial, token: str, report_in: Report, budget: ReportBudget
) -> Verdict:
    """Record a report from the trial's current attempt, within its budget; refuse anything
    else."""
    if trial.token_hash is None or token_hash(token) != trial.token_hash:
        raise TokenMismatch(f"trial {trial.id}: the report token does not match")
    if report_in.attempt != trial.attempt:
        raise ReportRefused(
            f"trial {trial.id}: report from attempt {report_in.attempt}, "
            f"the current attempt is {trial.attempt}"
        )
    if trial.status not in ACTIVE_TRIAL_STATUSES:
        raise ReportRefused(f"trial {trial.id} is {trial.status}, not running")
    if report_in.no_gpu is not None and trial.no_gpu is None:
        trial.no_gpu = report_in.no_gpu
        log.warning(
            "trial %s: %s sees no GPU on %s, where it was placed: it trains on the CPU, and the "
            "split search leaves it out",
            trial.id,
            report_in.no_gpu,
            trial.device,
        )
    report = Incoming(
        step=report_in.step,
        samples=report_in.samples,
        metrics=report_in.metrics,
        seconds=report_in.seconds,
        steps=report_in.steps,
        pool_mb=report_in.pool_mb,
        pool_at=None
        if report_in.pool_at is None
        else datetime.fromtimestamp(report_in.pool_at, UTC),
    )
    return _record(
        session=session, trial=trial, kind=report_in.kind, reports=[report], budget=budget
    )[0]


def add_line_reports(
    *,
    session: Session,
    trial: Trial,
    reports: Sequence[Incoming],
    budget: ReportBudget,
    read_to: int,
) -> list[Verdict]:
    """Record the GPUMUX_REPORT lines that the daemon read in the log of the trial's current
    attempt, within its budget, and the offset of its output they were read up to: stored with
    them, so that a restarted daemon reads on from there and finds none of them twice.

    Its status is not checked: the last lines of a trial that just ended count too. A line says
    no interval: the reader gives each report the seconds its samples took.
    """
    verdicts = _record(session=session, trial=trial, kind="line", reports=reports, budget=budget)
    trial.log_scanned = read_to
    return verdicts


def _record(
    *,
    session: Session,
    trial: Trial,
    kind: str,
    reports: Sequence[Incoming],
    budget: ReportBudget,
) -> list[Verdict]:
    """Store the reports within the budget: the transaction does a statement per new row or
    merged row, none per dropped report, and flushes once."""
    now = utcnow()
    metric = trial.sweep.objective_metric
    allowance = budget.allowance(
        trial.id, trial.attempt, lambda: _stored(session, trial.id, trial.attempt)
    )
    # The attempt's latest row, once a report needs it; a row made here is the latest at once.
    latest: TrialReport | None = None
    made = False
    dropped = 0
    verdicts = []
    for report in reports:
        samples, seconds, steps = report.samples, report.seconds, report.steps
        rate = _rate(samples, seconds)
        steps_rate = _rate(steps, seconds)
        # The trial's row follows every report, stored or not: its last step, objective, rates.
        if rate is not None:
            trial.samples_per_s = rate
        if steps_rate is not None:
            trial.steps_per_s = steps_rate
        if report.step is not None:
            trial.step = report.step
        if report.pool_mb is not None:
            # Never later than it arrived: a clock ahead of the daemon's tells nothing newer.
            told = now if report.pool_at is None else min(now, report.pool_at)
            trial.pool_mb, trial.pool_at = report.pool_mb, told
        if metric is not None and metric in report.metrics:
            trial.objective = report.metrics[metric]
        verdict = budget.decide(allowance, report.step)
        if verdict is not Verdict.row and latest is None:
            if allowance.latest is not None:
                latest = session.get(TrialReport, allowance.latest)
                if latest is not None and (latest.trial_id, latest.attempt) != (
                    trial.id,
                    trial.attempt,
                ):
                    # Its row was rolled back and SQLite gave the id to another's report.
                    latest = None
            if latest is None and allowance.has_latest:
                # Its transaction rolled back: this report starts the attempt's rows again.
                budget.take(allowance, report.step)
                verdict = Verdict.row
        verdicts.append(verdict)
        if verdict is Verdict.row:
            latest = TrialReport(
                trial_id=trial.id,
                attempt=trial.attempt,
                kind=kind,
                step=report.step,
                samples=samples,
                seconds=seconds,
                samples_per_s=rate,
                steps=steps,
                metrics=report.metrics,
                at=now,
            )
            session.add(latest)
            made = True
            continue
        if verdict is Verdict.merge:
            assert latest is not None
            latest.metrics = {**latest.metrics, **report.metrics}
            if seconds is not None:
                latest.seconds = (latest.seconds or 0.0) + seconds
        else:
            dropped += report.count
        if latest is not None:
            # The samples and steps count wherever they land, and the latest row says when
            # they came.
            if samples is not None:
                latest.samples = (latest.samples or 0.0) + samples
            if steps is not None:
                latest.steps = (latest.steps or 0.0) + steps
            if latest.samples is not None and latest.seconds:
                merged = latest.samples / latest.seconds
                latest.samples_per_s = merged if merged <= MAX_RATE else None
            latest.at = now
    trial.last_report_at = now
    if made:
        assert latest is not None
        session.flush()
        budget.settle(allowance, latest.id)
    if dropped:
        trial.reports_dropped += dropped
        if budget.first_drop(allowance):
            log.warning(
                "trial %s: reports over its budget (%g new rows/s, %d at once, %d per attempt); "
                "dropping the excess (their samples still count), %d so far",
                trial.id,
                budget.rate,
                budget.burst,
                budget.rows,
                trial.reports_dropped,
            )
    return verdicts


def _rate(count: float | None, seconds: float | None) -> float | None:
    """`count` per second; None without both, or for an absurd or infinite rate (many in a tiny
    interval): no rate is better than that."""
    rate = count / seconds if count is not None and seconds else None
    return rate if rate is not None and rate <= MAX_RATE else None


def _stored(session: Session, trial_id: int, attempt: int) -> Seed:
    """How many report rows the attempt holds, and its latest row's id and step."""
    where = (TrialReport.trial_id == trial_id, TrialReport.attempt == attempt)
    rows = session.scalar(select(func.count()).select_from(TrialReport).where(*where)) or 0
    latest = session.execute(
        select(TrialReport.id, TrialReport.step)
        .where(*where)
        .order_by(TrialReport.id.desc())
        .limit(1)
    ).first()
    return (rows, None, None) if latest is None else (rows, latest[0], latest[1])


def no_gpu_counts(*, session: Session, sweep_id: int) -> dict[str, int]:
    """How many of the sweep's trials saw no GPU where they were placed, by framework."""
    rows = session.execute(
        select(Trial.no_gpu, func.count())
        .where(Trial.sweep_id == sweep_id, Trial.no_gpu.is_not(None))
        .group_by(Trial.no_gpu)
    )
    return {framework: count for framework, count in rows if framework is not None}


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


def computing_spans(
    *, session: Session, device: str, since: datetime, end: datetime, node_id: int | None = None
) -> list[tuple[datetime, datetime | None]]:
    """When each trial on `device` that is active, or ended after `since`, computed: from its
    current attempt's first report of samples or steps by `end` (a trial starting up reports
    none) to its end (None: it runs); whatever its N or workload. With `node_id`, as
    `trials_at_split`."""
    ids = union(
        select(Trial.id).where(Trial.status.in_(ACTIVE_TRIAL_STATUSES)),
        select(Trial.id).where(Trial.ended_at > since),
    )
    query = (
        select(func.min(TrialReport.at), Trial.ended_at)
        .join(Trial, Trial.id == TrialReport.trial_id)
        .where(
            Trial.id.in_(ids),
            Trial.device == device,
            TrialReport.attempt == Trial.attempt,
            or_(TrialReport.samples.is_not(None), TrialReport.steps.is_not(None)),
            TrialReport.at <= end,
        )
        .group_by(Trial.id, Trial.ended_at)
    )
    if node_id is not None:
        query = query.where(or_(Trial.node_id == node_id, Trial.node_id.is_(None)))
    return [(first, ended) for first, ended in session.execute(query)]


def run_times(
    *, session: Session, sweep_id: int, device: str, node_id: int | None = None
) -> dict[int, list[float]]:
    """The seconds each trial of a sweep that ran to its end (succeeded) on `device` took, by
    the N it ran under."""
    query = select(Trial.split, Trial.started_at, Trial.ended_at).where(
        Trial.sweep_id == sweep_id,
        Trial.device == device,
        Trial.status == TrialStatus.succeeded,
        Trial.split.is_not(None),
    )
    if node_id is not None:
        query = query.where(or_(Trial.node_id == node_id, Trial.node_id.is_(None)))
    times: dict[int, list[float]] = {}
    for split, started, ended in session.execute(query):
        if split is not None and started is not None and ended is not None and ended > started:
            times.setdefault(split, []).append((ended - started).total_seconds())
    return times


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
    """The samples (or steps) each trial's current attempt reported in all; a report of more
    than one may hold (stored before reports were bounded) counts as the most it may: the sum
    of such reports overflows, which PostgreSQL refuses."""
    rows = session.execute(
        select(TrialReport.trial_id, func.sum(_bounded(counted)))
        .join(Trial, Trial.id == TrialReport.trial_id)
        .where(TrialReport.trial_id.in_(trial_ids), TrialReport.attempt == Trial.attempt)
        .group_by(TrialReport.trial_id)
    )
    return {trial_id: float(total or 0.0) for trial_id, total in rows}


def work_per_trial(
    *, session: Session, sweep_id: int, counted: Counted = "samples"
) -> float | None:
    """What one trial of a sweep does, in samples (or steps): the median of what its trials
    that ran to their end or were pruned reported in all (a pruned one's work is what the sweep's
    trials typically do); before any did, the most one of its trials reported so far (a bound
    from below, which grows as they run). None: none of them reported any."""
    rows = session.execute(
        select(Trial.status, func.sum(_bounded(counted)))
        .join(TrialReport, TrialReport.trial_id == Trial.id)
        .where(Trial.sweep_id == sweep_id, TrialReport.attempt == Trial.attempt)
        .group_by(Trial.id, Trial.status)
    ).all()
    totals = [(status, float(total)) for status, total in rows if total]
    ended = [total for status, total in totals if status in ENDED_WORK]
    if ended:
        return statistics.median(ended)
    return max((total for _, total in totals), default=None)


def _bounded(counted: Counted) -> ColumnElement[float | None]:
    """A report's samples (or steps) in a sum: at most what one report may hold (reports
    stored before they were bounded may hold more, and a sum of them overflows)."""
    column = _column(counted)
    return case((column > MAX_SAMPLES, MAX_SAMPLES), else_=column)


def _column(counted: Counted) -> InstrumentedAttribute[float | None]:
    return TrialReport.steps if counted == "steps" else TrialReport.samples
