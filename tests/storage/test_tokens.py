"""API tokens: issued, resolved, revoked, hashed at rest."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import func, select

from gpumux.config import Settings
from gpumux.storage.engine import Sessions
from gpumux.storage.models import ApiToken, Owner, token_hash, utcnow
from gpumux.storage.tokens import (
    TOKEN_PREFIX,
    create_token,
    find_token,
    note_use,
    revoke_tokens,
    use_is_due,
)


def issue(sessions: Sessions, owner_name: str, uid: int | None = None) -> str:
    with sessions.write.begin() as session:
        return create_token(session=session, owner_name=owner_name, uid=uid)


def resolve(sessions: Sessions, token: str, now: datetime | None = None) -> Owner | None:
    """Resolve as the API does: a read, then a note of the use when one is due."""
    with sessions.read() as session:
        row = find_token(session=session, token=token)
        if row is None:
            return None
        owner, token_id, due = row.owner, row.id, use_is_due(row, now or utcnow())
    if due:
        with sessions.write.begin() as session:
            note_use(session=session, token_id=token_id, now=now or utcnow())
    return owner


def test_a_token_resolves_to_its_owner(sessions: Sessions) -> None:
    token = issue(sessions, "alice", uid=1001)
    assert token.startswith(TOKEN_PREFIX)
    assert len(token) > len(TOKEN_PREFIX) + 40
    owner = resolve(sessions, token)
    assert owner is not None
    assert (owner.name, owner.uid) == ("alice", 1001)


def test_unknown_and_malformed_tokens_resolve_to_nobody(sessions: Sessions) -> None:
    token = issue(sessions, "alice")
    assert resolve(sessions, token[:-1] + ("A" if token[-1] != "A" else "B")) is None
    assert resolve(sessions, token.removeprefix(TOKEN_PREFIX)) is None
    assert resolve(sessions, "") is None


def test_tokens_of_one_user_share_their_owner_row(sessions: Sessions) -> None:
    first, second = issue(sessions, "alice"), issue(sessions, "alice")
    issue(sessions, "bob")
    assert first != second
    first_owner, second_owner = resolve(sessions, first), resolve(sessions, second)
    assert first_owner is not None and second_owner is not None
    assert first_owner.id == second_owner.id
    with sessions.read() as session:
        assert session.scalar(select(func.count()).select_from(Owner)) == 2


def test_revoked_tokens_resolve_to_nobody(sessions: Sessions) -> None:
    alice_tokens = [issue(sessions, "alice"), issue(sessions, "alice")]
    bob_token = issue(sessions, "bob")
    with sessions.write.begin() as session:
        assert revoke_tokens(session=session, owner_name="alice") == 2
    assert [resolve(sessions, token) for token in alice_tokens] == [None, None]
    bob = resolve(sessions, bob_token)
    assert bob is not None and bob.name == "bob"
    with sessions.write.begin() as session:
        assert revoke_tokens(session=session, owner_name="alice") == 0
        assert revoke_tokens(session=session, owner_name="nobody") == 0


def test_a_token_made_after_a_revocation_works(sessions: Sessions) -> None:
    issue(sessions, "alice")
    with sessions.write.begin() as session:
        revoke_tokens(session=session, owner_name="alice")
    owner = resolve(sessions, issue(sessions, "alice"))
    assert owner is not None and owner.name == "alice"


def test_use_is_recorded_at_most_once_a_minute(sessions: Sessions) -> None:
    token = issue(sessions, "alice")
    start = utcnow()

    def last_used() -> datetime | None:
        with sessions.read() as session:
            return session.scalar(select(ApiToken.last_used_at))

    assert last_used() is None
    resolve(sessions, token, now=start)
    assert last_used() == start
    resolve(sessions, token, now=start + timedelta(seconds=59))
    assert last_used() == start
    resolve(sessions, token, now=start + timedelta(seconds=61))
    assert last_used() == start + timedelta(seconds=61)


@pytest.mark.sqlite_only(reason="reads the SQLite file's bytes")
def test_only_the_hash_is_stored(sessions: Sessions, settings: Settings) -> None:
    token = issue(sessions, "alice")
    database = settings.home / "gpumux.db"
    stored = b"".join(
        path.read_bytes()
        for path in database.parent.iterdir()
        if path.name.startswith(database.name)
    )
    assert token_hash(token).encode() in stored  # the right files were read
    assert token.encode() not in stored
    assert token.removeprefix(TOKEN_PREFIX).encode() not in stored
