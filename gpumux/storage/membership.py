"""Node membership: a daemon joins the nodes sharing its database, renews its lease by
heartbeat, and leaves; the nodes whose lease lapsed lose their trials to the queue.

Every lease is measured on the database's clock (`Dialect.now()`), so nodes whose own clocks
disagree still agree on who is late. Each function runs in the caller's write transaction:
writes are serialised (SQLite's writer lock, PostgreSQL's advisory lock), so a read and the
write it decides are never split by another node's.
"""

from __future__ import annotations

import logging
import os
import secrets
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import CursorResult, func, select, type_coerce, update
from sqlalchemy.orm import Session

from gpumux.home.layout import Layout
from gpumux.status import ACTIVE_TRIAL_STATUSES, NodeState
from gpumux.storage import lifecycle
from gpumux.storage.dialects import dialect_for
from gpumux.storage.models import Node, Trial, UtcDateTime, token_hash
from gpumux.storage.nodes import NodeIdentity

log = logging.getLogger(__name__)


class NodeNameTaken(RuntimeError):
    """Another live daemon holds this node name; the message says what to do."""


def home_id(home: Path) -> str:
    """The random id of this data directory, made on first use and kept in it."""
    path = Layout(home).node_id
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    made = str(uuid.uuid4())
    with os.fdopen(fd, "w") as file:
        file.write(made + "\n")
        file.flush()
        os.fsync(file.fileno())
    return made


def database_now(session: Session) -> datetime:
    """The database's clock now, aware UTC."""
    dialect = dialect_for(session.get_bind().engine.url)
    now = session.scalar(select(type_coerce(dialect.now(), UtcDateTime())))
    assert now is not None
    return now


def join(
    *,
    session: Session,
    name: str,
    home: str,
    url: str | None,
    pid: int,
    lease_s: float,
    lost_retries: int,
    devices: Sequence[dict[str, Any]] = (),
    secret: str | None = None,
) -> NodeIdentity:
    """Register this daemon as node `name` (its data directory's id `home`), as a new
    incarnation: a restart takes its own row back, under a new name too (its trials stay
    its own); a row whose lease lapsed or that left is taken over (its trials requeued within
    `lost_retries` first); a name another live daemon holds is refused (NodeNameTaken).
    `secret`: the one to keep (a rejoin), else a new one."""
    now = database_now(session)
    named = session.scalar(select(Node).where(Node.name == name))
    if named is not None and named.home_id != home:
        if named.state is NodeState.active and named.lease_until >= now:
            raise NodeNameTaken(
                f"node name {name!r} is held by another live daemon (pid {named.pid}, a "
                f"different data directory, lease until {named.lease_until:%H:%M:%S} UTC); "
                "give this one its own name with GPUMUX_NODE_NAME, or stop the other"
            )
        # Its trials go back to the queue before the row changes hands.
        expire(session=session, lost_retries=lost_retries, only=named.id)
    row = own_row(session=session, home=home, named=named)
    secret = secret or secrets.token_urlsafe(32)
    fields = {
        "home_id": home,
        "state": NodeState.active,
        "url": url,
        "token_hash": token_hash(secret),
        "pid": pid,
        "devices": list(devices),
        "started_at": now,
        "heartbeat_at": now,
        "lease_until": now + timedelta(seconds=lease_s),
    }
    if row is None:
        row = Node(name=name, incarnation=1, **fields)
        session.add(row)
    else:
        if row.name != name:
            log.info("node %s: renamed %s; its data directory is the same", row.name, name)
            row.name = name
        for field, value in fields.items():
            setattr(row, field, value)
        row.incarnation += 1
    session.flush()
    log.info("node %s: joined as incarnation %d (node id %d)", name, row.incarnation, row.id)
    return NodeIdentity(id=row.id, name=name, incarnation=row.incarnation, secret=secret)


def own_row(*, session: Session, home: str, named: Node | None) -> Node | None:
    """The row this join takes: this data directory's active row (its trials, left running by
    a warm stop, are this node's whatever it is called now), else the row named as asked.
    Renamed, it takes the name; when another, dead row holds that name, that row is taken
    and the active trials move onto it (a data directory has one active row)."""
    own = session.scalars(
        select(Node)
        .where(Node.home_id == home, Node.state == NodeState.active)
        .order_by(Node.heartbeat_at.desc(), Node.id)
    ).first()
    if own is None or own is named:
        return named
    if named is None:
        return own
    log.info("node %s: its data directory's trials move to node %s", own.name, named.name)
    session.execute(
        update(Trial)
        .where(Trial.node_id == own.id, Trial.status.in_(ACTIVE_TRIAL_STATUSES))
        .values(node_id=named.id)
    )
    own.state = NodeState.left
    return named


def heartbeat(
    *,
    session: Session,
    node: NodeIdentity,
    lease_s: float,
    devices: Sequence[dict[str, Any]] | None = None,
) -> bool:
    """Renew this incarnation's lease (and note its devices); False when the lease is lost:
    another node expired it, or a later incarnation took the row."""
    now = database_now(session)
    values: dict[str, Any] = {"heartbeat_at": now, "lease_until": now + timedelta(seconds=lease_s)}
    if devices is not None:
        values["devices"] = list(devices)
    renewed = session.execute(
        update(Node)
        .where(
            Node.id == node.id,
            Node.incarnation == node.incarnation,
            Node.state == NodeState.active,
        )
        .values(**values)
    )
    assert isinstance(renewed, CursorResult)
    return renewed.rowcount == 1


def expire(*, session: Session, lost_retries: int, only: int | None = None) -> list[str]:
    """Mark lost every active node whose lease lapsed and requeue its active trials within
    their retry budget (`lost_retries`); the names of the nodes expired. A node that renewed
    its lease before this transaction is left alone: the lapse is read in it."""
    now = database_now(session)
    query = select(Node).where(Node.state == NodeState.active, Node.lease_until < now)
    if only is not None:
        query = query.where(Node.id == only)
    expired = []
    for node in session.scalars(query.order_by(Node.id)).all():
        node.state = NodeState.lost
        trials = session.scalars(
            select(Trial)
            .where(Trial.node_id == node.id, Trial.status.in_(ACTIVE_TRIAL_STATUSES))
            .order_by(Trial.id)
        ).all()
        for trial in trials:
            lifecycle.requeue_or_lose(
                session=session,
                trial=trial,
                why=f"was on node {node.name}, whose lease lapsed",
                lost_retries=lost_retries,
            )
        log.warning(
            "node %s: lease lapsed at %s UTC; marked lost, %d trials requeued or lost",
            node.name,
            f"{node.lease_until:%H:%M:%S}",
            len(trials),
        )
        expired.append(node.name)
    session.flush()
    return expired


def leave(*, session: Session, node: NodeIdentity) -> bool:
    """Mark this incarnation left at a clean stop, unless it still holds active trials (they
    run on under their supervisors for its next start to adopt); whether it left."""
    holding = session.scalar(
        select(func.count()).where(
            Trial.node_id == node.id, Trial.status.in_(ACTIVE_TRIAL_STATUSES)
        )
    )
    if holding:
        return False
    left = session.execute(
        update(Node)
        .where(
            Node.id == node.id,
            Node.incarnation == node.incarnation,
            Node.state == NodeState.active,
        )
        .values(state=NodeState.left)
    )
    assert isinstance(left, CursorResult)
    return left.rowcount == 1
