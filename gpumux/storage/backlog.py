"""How much work waits: trials queued, and trials that open adaptive sweeps have yet to ask of
their samplers (the one count of what a sweep asked so far)."""

from __future__ import annotations

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from gpumux.status import (
    ACTIVE_TRIAL_STATUSES,
    SearchMethod,
    SweepStatus,
    TrialStatus,
)
from gpumux.storage.models import Owner, Sweep, Trial


def asked_count(*, session: Session, sweep: Sweep) -> int:
    """How many trials a sweep has: all of a grid's; those an adaptive sweep asked so far."""
    return session.scalar(select(func.count()).where(Trial.sweep_id == sweep.id)) or 0


def unasked(*, session: Session, sweeps: Select[Sweep]) -> int:
    """Trials that the open adaptive sweeps among `sweeps` have yet to ask of their samplers."""
    open_adaptive = (
        sweeps.where(
            Sweep.search.not_in((SearchMethod.grid, SearchMethod.random)),
            Sweep.status.in_((SweepStatus.queued, SweepStatus.running)),
            Sweep.cancel_requested.is_(False),
        )
        .with_only_columns(Sweep.id, Sweep.trial_count)
        .subquery()
    )
    asked = (
        select(Trial.sweep_id, func.count().label("n"))
        .where(Trial.sweep_id.in_(select(open_adaptive.c.id)))
        .group_by(Trial.sweep_id)
        .subquery()
    )
    left = session.scalar(
        select(func.sum(open_adaptive.c.trial_count - func.coalesce(asked.c.n, 0))).outerjoin(
            asked, asked.c.sweep_id == open_adaptive.c.id
        )
    )
    return int(left or 0)


def queued_count(*, session: Session, owner: str) -> int:
    """How many trials of this user's sweeps wait in the queue, counting those that adaptive
    sweeps have yet to ask."""
    queued = (
        session.scalar(
            select(func.count())
            .select_from(Trial)
            .join(Sweep)
            .join(Owner)
            .where(Owner.name == owner, Trial.status == TrialStatus.queued)
        )
        or 0
    )
    adaptive = select(Sweep).join(Owner).where(Owner.name == owner)
    return queued + unasked(session=session, sweeps=adaptive)


def pending_work(*, session: Session) -> int:
    """How many trials are queued, hold a slot, or are yet to be asked by an adaptive sweep."""
    unfinished = (TrialStatus.queued, *ACTIVE_TRIAL_STATUSES)
    waiting = session.scalar(select(func.count()).where(Trial.status.in_(unfinished))) or 0
    return waiting + unasked(session=session, sweeps=select(Sweep))
