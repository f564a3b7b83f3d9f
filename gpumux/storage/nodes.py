"""The nodes that share the database: who this daemon is among them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeIdentity:
    """This daemon's node: its row, the incarnation it joined as, and the secret it shows
    another node it asks (the row keeps only the secret's hash)."""

    id: int
    name: str
    incarnation: int
    secret: str
