"""Owners, sweeps and trials: their reads and writes, and the gate that changes a status."""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import CursorResult, Select, func, select, update
from sqlalchemy.orm import Session

from gpumux.schemas import SweepCreate, parse_objective
from gpumux.status import (
    ACTIVE_TRIAL_STATUSES,
    FINAL_TRIAL_STATUSES,
    TRIAL_TRANSITIONS,
    NodeState,
    ObjectiveMode,
    SearchMethod,
    SweepStatus,
    TrialStatus,
)
from gpumux.storage.models import Node, Owner, Sweep, Trial, utcnow
from gpumux.storage.nodes import NodeIdentity

log = logging.getLogger(__name__)


class IllegalTransition(RuntimeError):
    """A trial status change that the lifecycle does not allow."""


def get_or_create_owner(*, session: Session, name: str, uid: int | None = None) -> Owner:
    """The owner row for a user name, created on first use."""
    owner = session.scalar(select(Owner).where(Owner.name == name))
    if owner is None:
        owner = Owner(name=name, uid=uid)
        session.add(owner)
        session.flush()
    elif owner.uid is None and uid is not None:
        owner.uid = uid
    return owner


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


def asked_count(*, session: Session, sweep: Sweep) -> int:
    """How many trials a sweep has: all of a grid's; those an adaptive sweep asked so far."""
    return session.scalar(select(func.count()).where(Trial.sweep_id == sweep.id)) or 0


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


def list_trials(
    *,
    session: Session,
    sweep_id: int,
    status: TrialStatus | None = None,
    offset: int = 0,
    limit: int = 100,
) -> tuple[list[Trial], int]:
    """A page of a sweep's trials in their order, and how many match in all."""
    where = [Trial.sweep_id == sweep_id]
    if status is not None:
        where.append(Trial.status == status)
    count = session.scalar(select(func.count()).select_from(Trial).where(*where)) or 0
    page = session.scalars(
        select(Trial).where(*where).order_by(Trial.number).offset(offset).limit(limit)
    )
    return list(page), count


def get_trial(*, session: Session, trial_id: int) -> Trial | None:
    """One trial by id."""
    return session.get(Trial, trial_id)


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


def queued_trials_of(*, session: Session, sweep: Sweep, limit: int) -> list[Trial]:
    """A sweep's queued trials in their order, at most `limit`."""
    return list(
        session.scalars(
            select(Trial)
            .where(Trial.sweep_id == sweep.id, Trial.status == TrialStatus.queued)
            .order_by(Trial.number)
            .limit(limit)
        )
    )


def active_trials(*, session: Session, node_id: int | None = None) -> list[Trial]:
    """Trials that hold a device slot: starting or running. With `node_id`, only that node's
    and those written before nodes existed (no node: the one daemon of those days adopts them)."""
    query = select(Trial).where(Trial.status.in_(ACTIVE_TRIAL_STATUSES))
    if node_id is not None:
        query = query.where((Trial.node_id == node_id) | Trial.node_id.is_(None))
    return list(session.scalars(query.order_by(Trial.id)))


def claim_trial(*, session: Session, trial_id: int, node: NodeIdentity | None) -> Trial | None:
    """The queued trial, locked for this node to launch, or None: no longer queued, locked by
    another node's claim, or this node's lease lost (a lost node claims nothing)."""
    if node is not None and not session.scalar(
        select(func.count()).where(
            Node.id == node.id,
            Node.incarnation == node.incarnation,
            Node.state == NodeState.active,
        )
    ):
        return None
    return session.scalar(
        select(Trial)
        .where(Trial.id == trial_id, Trial.status == TrialStatus.queued)
        .with_for_update(skip_locked=True)
    )


def still_held(trial: Trial, *, node_id: int | None, attempt: int) -> str | None:
    """Why this node may no longer write the trial's lifecycle for `attempt` (requeued, run
    by another node, or ended), or None while it may."""
    if trial.attempt != attempt:
        return f"now attempt {trial.attempt}, {trial.status}"
    if trial.status not in ACTIVE_TRIAL_STATUSES:
        return f"now {trial.status}"
    if node_id is not None and trial.node_id not in (node_id, None):
        return f"now on node {trial.node_id}"
    return None


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


def pending_work(*, session: Session) -> int:
    """How many trials are queued, hold a slot, or are yet to be asked by an adaptive sweep."""
    unfinished = (TrialStatus.queued, *ACTIVE_TRIAL_STATUSES)
    waiting = session.scalar(select(func.count()).where(Trial.status.in_(unfinished))) or 0
    return waiting + unasked(session=session, sweeps=select(Sweep))


def cancel_queued_trials(*, session: Session, sweep: Sweep) -> int:
    """Cancel all of a sweep's queued trials in one statement; returns how many."""
    if TrialStatus.cancelled not in TRIAL_TRANSITIONS[TrialStatus.queued]:
        raise IllegalTransition("queued -> cancelled is not allowed")
    result: CursorResult[Any] = session.execute(  # type: ignore[assignment]
        update(Trial)
        .where(Trial.sweep_id == sweep.id, Trial.status == TrialStatus.queued)
        .values(status=TrialStatus.cancelled, ended_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    session.expire_all()
    refresh_sweep_status(session=session, sweep=sweep)
    return result.rowcount


def set_trial_status(
    *, session: Session, trial: Trial, status: TrialStatus, **fields: Any
) -> Trial:
    """Move a trial to `status` (setting `fields` with it) if the lifecycle allows the move."""
    if status not in TRIAL_TRANSITIONS[trial.status]:
        raise IllegalTransition(f"trial {trial.id}: {trial.status} -> {status} is not allowed")
    for name, value in fields.items():
        if not hasattr(Trial, name):
            raise AttributeError(f"Trial has no field {name!r}")
        setattr(trial, name, value)
    log.debug("trial %s: %s -> %s", trial.id, trial.status, status)
    trial.status = status
    session.flush()
    refresh_sweep_status(session=session, sweep=trial.sweep)
    return trial


def refresh_sweep_status(*, session: Session, sweep: Sweep, now: datetime | None = None) -> None:
    """Derive a sweep's status from its trials' (called after every trial transition)."""
    counts = trial_counts(session=session, sweep_ids=[sweep.id])[sweep.id]
    final = sum(count for status, count in counts.items() if status in FINAL_TRIAL_STATUSES)
    unfinished = counts.get(TrialStatus.queued, 0) + sum(
        counts.get(status, 0) for status in ACTIVE_TRIAL_STATUSES
    )
    # A cancelled adaptive sweep ends with the trials it asked, short of its budget.
    if final >= sweep.trial_count or (sweep.cancel_requested and not unfinished):
        status = SweepStatus.cancelled if sweep.cancel_requested else SweepStatus.finished
        if sweep.finished_at is None:
            sweep.finished_at = now or utcnow()
    elif final or any(counts.get(status) for status in ACTIVE_TRIAL_STATUSES):
        status = SweepStatus.running
    else:
        status = SweepStatus.queued
    if status != sweep.status:
        log.info("sweep %s: %s -> %s", sweep.id, sweep.status, status)
        sweep.status = status


def requeue_or_lose(*, session: Session, trial: Trial, why: str, lost_retries: int) -> None:
    """Run a trial cut off by gpumux (or by its node's end) again, within its retry budget;
    else record it lost."""
    if trial.attempt <= lost_retries:
        requeue(session=session, trial=trial, why=why, then="requeued")
    else:
        set_trial_status(
            session=session,
            trial=trial,
            status=TrialStatus.lost,
            error=f"attempt {trial.attempt} {why}; no retries left",
            ended_at=utcnow(),
        )


def requeue(
    *, session: Session, trial: Trial, why: str, then: str, failures: int | None = None
) -> None:
    """Queue a trial for its next attempt, on whichever node claims it, noting what happened
    to this one."""
    set_trial_status(
        session=session,
        trial=trial,
        status=TrialStatus.queued,
        attempt=trial.attempt + 1,
        failures=trial.failures if failures is None else failures,
        error=f"attempt {trial.attempt} {why}; {then}",
        queued_at=utcnow(),
        pid=None,
        log_path=None,
        node_id=None,
    )
