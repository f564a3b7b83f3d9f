"""The nodes that share the database: who this daemon is among them, and what they show."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpumux.status import ACTIVE_TRIAL_STATUSES, NodeState
from gpumux.storage.models import Node, Trial, token_hash


@dataclass(frozen=True)
class NodeIdentity:
    """This daemon's node: its row, the incarnation it joined as, and the secret it shows
    another node it asks (the row keeps only the secret's hash)."""

    id: int
    name: str
    incarnation: int
    secret: str = field(repr=False)


class ThisNode:
    """The node a scheduler runs trials for, one object its collaborators share (the launcher,
    the filler, the log readers, the split searches): a rejoin changes it for all of them at
    once. Without an identity, the database's only scheduler (a tool, a test), which owns every
    trial."""

    def __init__(self, identity: NodeIdentity | None = None) -> None:
        self.identity = identity

    @property
    def id(self) -> int | None:
        return None if self.identity is None else self.identity.id


def list_nodes(*, session: Session) -> list[Node]:
    """Every node that ever joined, by name (those that left or were lost too)."""
    return list(session.scalars(select(Node).order_by(Node.name)))


def get_node(*, session: Session, node_id: int) -> Node | None:
    """The node with this id, or None."""
    return session.get(Node, node_id)


def active_nodes(*, session: Session) -> list[Node]:
    """The nodes that have joined and not left nor been found lost, by name."""
    return list(
        session.scalars(select(Node).where(Node.state == NodeState.active).order_by(Node.name))
    )


def lease_is_live(node: Node, now: datetime) -> bool:
    """Whether the node is a member now: active, and its lease not yet run out."""
    return node.state is NodeState.active and node.lease_until > now


def active_trial_counts(*, session: Session) -> dict[int | None, int]:
    """Per node id, how many trials hold a slot on it (None: trials from before nodes)."""
    rows = session.execute(
        select(Trial.node_id, func.count())
        .where(Trial.status.in_(ACTIVE_TRIAL_STATUSES))
        .group_by(Trial.node_id)
    )
    return {node_id: count for node_id, count in rows}


def node_of_secret(*, session: Session, node_id: int, secret: str) -> Node | None:
    """The active node whose current incarnation shows this secret, or None."""
    node = session.get(Node, node_id)
    if node is None or node.token_hash is None or node.state is not NodeState.active:
        return None
    # Constant time: how much of a guess matches must not show in how long the answer takes.
    if not hmac.compare_digest(token_hash(secret), node.token_hash):
        return None
    return node
