"""Owners: the row of each user name that submits sweeps."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpumux.storage.models import Owner


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
