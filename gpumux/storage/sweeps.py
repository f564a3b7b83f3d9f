"""Sweeps: their creation with their queued trials, their reads, and the intent to cancel one."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from gpumux.schemas import SweepCreate, parse_objective
from gpumux.status import ObjectiveMode, SearchMethod, SweepStatus, TrialStatus
from gpumux.storage.models import Owner, Sweep, Trial, utcnow


def create_sweep(
    *,
    session: Session,
    sweep_in: SweepCreate,
    owner: Owner,
    seed: int,
    trial_params: Sequence[dict[str, Any]],
    search: SearchMethod = SearchMethod.grid,
    search_options: dict[str, Any] | None = None,
    prune: str | None = None,
) -> Sweep:
    """A sweep and its queued trials, in the caller's transaction. An adaptive search's trials
    are asked as slots free: none is stored now, and its budget is `sweep_in.trials`."""
    metric, mode = parse_objective(sweep_in.objective) if sweep_in.objective else (None, None)
    sweep = Sweep(
        name=sweep_in.name,
        owner=owner,
        owner_id=owner.id,
        command=sweep_in.command,
        param_tokens=sweep_in.params,
        workdir=sweep_in.workdir,
        env=sweep_in.env,
        random_trials=sweep_in.trials,
        search=search,
        search_options=search_options or None,
        prune=prune,
        seed=seed,
        split=None if sweep_in.split == "auto" else sweep_in.split,
        objective_metric=metric,
        objective_mode=ObjectiveMode(mode) if mode else None,
        time_limit_s=sweep_in.time_limit_s,
        retries=sweep_in.retries,
        priority=sweep_in.priority,
        warm=sweep_in.warm,
        trial_count=sweep_in.trials or 0 if search.adaptive else len(trial_params),
    )
    session.add(sweep)
    session.flush()
    now = utcnow()
    session.add_all(
        Trial(sweep_id=sweep.id, number=number, params=params, queued_at=now)
        for number, params in enumerate(trial_params)
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
