"""Sweeps: their creation with their queued trials, their reads, and the intent to cancel one."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from gpumux.grammar.sweepplan import SweepPlan
from gpumux.status import ObjectiveMode, SweepStatus, TrialStatus
from gpumux.storage.models import Owner, Sweep, Trial, utcnow


def create_sweep(*, session: Session, plan: SweepPlan, owner: Owner) -> Sweep:
    """A planned sweep and its queued trials, in the caller's transaction. An adaptive
    search's trials are asked as slots free: none is stored now."""
    sweep = Sweep(
        name=plan.name,
        owner=owner,
        owner_id=owner.id,
        command=plan.command,
        param_tokens=plan.param_tokens,
        workdir=plan.workdir,
        env=plan.env,
        trial_budget=plan.trial_budget,
        search=plan.search,
        search_options=plan.search_options or None,
        prune=plan.prune,
        seed=plan.seed,
        split=plan.split,
        objective_metric=plan.metric,
        objective_mode=plan.mode,
        time_limit_s=plan.time_limit_s,
        retries=plan.retries,
        priority=plan.priority,
        preload=plan.preload,
        trial_count=plan.trial_count,
    )
    session.add(sweep)
    session.flush()
    now = utcnow()
    session.add_all(
        Trial(sweep_id=sweep.id, number=number, params=params, queued_at=now)
        for number, params in enumerate(plan.trial_params)
    )
    session.flush()
    return sweep


def _sweeps_query(
    *, status: SweepStatus | None, owner: str | None, name: str | None = None
) -> Select[Sweep]:
    query = select(Sweep)
    if status is not None:
        query = query.where(Sweep.status == status)
    if name is not None:
        query = query.where(Sweep.name == name)
    if owner is not None:
        query = query.join(Owner).where(Owner.name == owner)
    return query


def list_sweeps(
    *,
    session: Session,
    status: SweepStatus | None = None,
    owner: str | None = None,
    name: str | None = None,
    offset: int = 0,
    limit: int = 50,
) -> tuple[list[Sweep], int]:
    """A page of sweeps (of this name, where given), newest first, and how many match in all."""
    query = _sweeps_query(status=status, owner=owner, name=name)
    count = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    page = session.scalars(query.order_by(Sweep.id.desc()).offset(offset).limit(limit))
    return list(page), count


def get_sweep(*, session: Session, sweep_id: int) -> Sweep | None:
    """One sweep by id."""
    return session.get(Sweep, sweep_id)


def trial_counts(
    *, session: Session, sweep_ids: Collection[int]
) -> dict[int, dict[TrialStatus, int]]:
    """For each sweep, the number of its trials in each status."""
    counts: dict[int, dict[TrialStatus, int]] = {sweep_id: {} for sweep_id in sweep_ids}
    rows = session.execute(
        select(Trial.sweep_id, Trial.status, func.count())
        .where(Trial.sweep_id.in_(sweep_ids))
        .group_by(Trial.sweep_id, Trial.status)
    )
    for sweep_id, status, count in rows:
        counts[sweep_id][TrialStatus(status)] = count
    return counts


def best_trial(*, session: Session, sweep: Sweep) -> Trial | None:
    """The trial whose objective ranks first, or None without an objective or a value."""
    if sweep.objective_mode is None:
        return None
    order = (
        Trial.objective.asc()
        if sweep.objective_mode == ObjectiveMode.min
        else Trial.objective.desc()
    )
    return session.scalar(
        select(Trial)
        .where(Trial.sweep_id == sweep.id, Trial.objective.is_not(None))
        .order_by(order, Trial.id)
        .limit(1)
    )


def request_cancel(*, session: Session, sweep: Sweep) -> Sweep:
    """Record the intent to cancel; the scheduler stops the trials."""
    if sweep.status not in (SweepStatus.finished, SweepStatus.cancelled):
        sweep.cancel_requested = True
    return sweep


def open_sweeps(*, session: Session) -> list[Sweep]:
    """Sweeps that may still start trials, in the order they get slots: higher priority first,
    then first come first served; sweeps being cancelled are left out."""
    return list(
        session.scalars(
            select(Sweep)
            .where(
                Sweep.status.in_((SweepStatus.queued, SweepStatus.running)),
                Sweep.cancel_requested.is_(False),
            )
            .order_by(Sweep.priority.desc(), Sweep.id)
        )
    )


def sweeps_to_cancel(*, session: Session) -> list[Sweep]:
    """Sweeps whose cancel was asked for and that still have trials to stop."""
    return list(
        session.scalars(
            select(Sweep).where(
                Sweep.cancel_requested.is_(True),
                Sweep.status.in_((SweepStatus.queued, SweepStatus.running)),
            )
        )
    )
