"""Counts and durations over the whole database, for /health and the Prometheus scrape."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, SQLColumnExpression, and_, case, func, select
from sqlalchemy.orm import Session

from gpumux.status import ACTIVE_TRIAL_STATUSES, FINAL_TRIAL_STATUSES, SweepStatus, TrialStatus
from gpumux.storage.dialects.base import Dialect
from gpumux.storage.models import Sweep, Trial


@dataclass(frozen=True)
class DeviceLoad:
    """What the trials that hold slots on one device add up to."""

    trials: int = 0
    samples_per_s: float = 0.0
    split: int = 0


@dataclass(frozen=True)
class Histogram:
    """Observations counted per bucket (bucket i: at most bounds[i]; the last: above all) and
    their sum."""

    counts: tuple[int, ...]
    total: float


def trials_by_status(*, session: Session) -> dict[TrialStatus, int]:
    """How many trials are in each status, every status present."""
    counts = dict(session.execute(select(Trial.status, func.count()).group_by(Trial.status)).all())
    return {status: counts.get(status, 0) for status in TrialStatus}


def sweeps_by_status(*, session: Session) -> dict[SweepStatus, int]:
    """How many sweeps are in each status, every status present."""
    counts = dict(session.execute(select(Sweep.status, func.count()).group_by(Sweep.status)).all())
    return {status: counts.get(status, 0) for status in SweepStatus}


def queue_waits(*, session: Session, dialect: Dialect, bounds: Sequence[float]) -> Histogram:
    """Seconds from queued to started of each trial that started (its latest attempt)."""
    return _seconds_histogram(
        session,
        dialect,
        start=Trial.queued_at,
        end=Trial.started_at,
        where=and_(Trial.status != TrialStatus.queued, Trial.started_at.is_not(None)),
        bounds=bounds,
    )


def run_durations(*, session: Session, dialect: Dialect, bounds: Sequence[float]) -> Histogram:
    """Seconds from started to ended of each trial that ran and ended, whichever way."""
    return _seconds_histogram(
        session,
        dialect,
        start=Trial.started_at,
        end=Trial.ended_at,
        where=and_(
            Trial.status.in_(FINAL_TRIAL_STATUSES),
            Trial.started_at.is_not(None),
            Trial.ended_at.is_not(None),
        ),
        bounds=bounds,
    )


def _seconds_histogram(
    session: Session,
    dialect: Dialect,
    *,
    start: SQLColumnExpression[Any],
    end: SQLColumnExpression[Any],
    where: ColumnElement[bool],
    bounds: Sequence[float],
) -> Histogram:
    seconds = dialect.seconds_between(start, end)
    # Bucketed here rather than with a SUM(CASE ...) per bucket: SQLite would compute the
    # difference once per bucket and row, three times slower than fetching one float a row.
    counts = [0] * (len(bounds) + 1)
    total = 0.0
    for value in session.scalars(select(seconds).where(where, end >= start)):
        counts[bisect.bisect_left(bounds, value)] += 1
        total += value
    return Histogram(counts=tuple(counts), total=total)


def device_loads(*, session: Session) -> dict[str, DeviceLoad]:
    """Per device key: trials holding a slot (starting or running), their samples/s, the split."""
    rows = session.execute(
        select(
            Trial.device,
            func.count(),
            func.coalesce(
                func.sum(case((Trial.status == TrialStatus.running, Trial.samples_per_s))), 0.0
            ),
            func.coalesce(func.max(Trial.split), 0),
        )
        .where(Trial.status.in_(ACTIVE_TRIAL_STATUSES), Trial.device.is_not(None))
        .group_by(Trial.device)
    )
    return {
        device: DeviceLoad(trials=count, samples_per_s=float(rate), split=int(split))
        for device, count, rate, split in rows
    }
