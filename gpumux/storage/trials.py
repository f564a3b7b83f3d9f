"""Trials: their reads, a node's claim of a queued one, and the fence on what it may still write."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpumux.status import (
    ACTIVE_TRIAL_STATUSES,
    NodeState,
    TrialStatus,
)
from gpumux.storage.dialects import dialect_for
from gpumux.storage.models import Node, Sweep, Trial
from gpumux.storage.nodes import NodeIdentity


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
    another node's claim, or this node's lease lost or run out on the database's clock (not
    yet marked lost, its trials are any other node's to requeue at its next heartbeat)."""
    if node is not None and not session.scalar(
        select(func.count()).where(
            Node.id == node.id,
            Node.incarnation == node.incarnation,
            Node.state == NodeState.active,
            Node.lease_until > dialect_for(session.get_bind().engine.url).now(),
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


def adopt_nodeless(*, session: Session, trial: Trial, node_id: int | None) -> None:
    """A trial written before nodes existed (it has none) becomes `node_id`'s: the one daemon
    of those days is the node that finds it active. Another node's trial stays its own."""
    if trial.node_id is None:
        trial.node_id = node_id
