"""API tokens: who is asking over TCP. Only a token's SHA-256 is stored."""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta

from sqlalchemy import CursorResult, select, update
from sqlalchemy.orm import Session

from gpumux.storage import owners as owner_store
from gpumux.storage.models import ApiToken, Owner, token_hash, utcnow

TOKEN_PREFIX = "gmx_"

# Recording every use would make each TCP request a write; a minute's precision is plenty.
TOUCH_INTERVAL = timedelta(minutes=1)


def create_token(*, session: Session, owner_name: str, uid: int | None = None) -> str:
    """A new token for the user (created as an owner on first use); only its hash is stored."""
    owner = owner_store.get_or_create_owner(session=session, name=owner_name, uid=uid)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiToken(owner_id=owner.id, token_hash=token_hash(token)))
    session.flush()
    return token


def find_token(*, session: Session, token: str) -> ApiToken | None:
    """The stored token that is not revoked, or None; reads only."""
    if not token.startswith(TOKEN_PREFIX):
        return None
    return session.scalar(
        select(ApiToken).where(
            ApiToken.token_hash == token_hash(token), ApiToken.revoked_at.is_(None)
        )
    )


def resolve_token(*, session: Session, token: str) -> Owner | None:
    """The owner of a token that is not revoked, or None; reads only."""
    row = find_token(session=session, token=token)
    return None if row is None else row.owner


def use_is_due(row: ApiToken, now: datetime) -> bool:
    """Whether the token's last use is worth writing down (at most once a minute)."""
    return row.last_used_at is None or now - row.last_used_at >= TOUCH_INTERVAL


def note_use(*, session: Session, token_id: int, now: datetime) -> None:
    """Write down that the token was used now (a write: keep it off the request's way)."""
    session.execute(update(ApiToken).where(ApiToken.id == token_id).values(last_used_at=now))


def revoke_tokens(*, session: Session, owner_name: str, now: datetime | None = None) -> int:
    """Revoke every live token of the user; how many there were."""
    owner_ids = select(Owner.id).where(Owner.name == owner_name).scalar_subquery()
    result = session.execute(
        update(ApiToken)
        .where(ApiToken.owner_id == owner_ids, ApiToken.revoked_at.is_(None))
        .values(revoked_at=now or utcnow())
    )
    assert isinstance(result, CursorResult)
    return result.rowcount
