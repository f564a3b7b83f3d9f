"""Routes for API tokens: made over the Unix socket, where the kernel vouches for the caller."""

from __future__ import annotations

import logging

from fastapi import APIRouter, HTTPException, Request, status

from gpumux.home import accounts
from gpumux.schemas.tokens import TokenCreate, TokenCreated, TokensRevoked
from gpumux.server import identity
from gpumux.server.api.deps import CallerDep, StateDep, UserName, refuse_unless_owner
from gpumux.server.api.responses import AUTHENTICATED, WRITES, problems
from gpumux.server.api.shown import shown
from gpumux.storage import tokens

log = logging.getLogger(__name__)

router = APIRouter(tags=["tokens"], responses=problems(*AUTHENTICATED, 422, *WRITES))


@router.post("/tokens", status_code=status.HTTP_201_CREATED, responses=problems(404))
def create_token(
    token_in: TokenCreate, request: Request, state: StateDep, caller: CallerDep
) -> TokenCreated:
    """A new token for the caller, or (admins) for another user; shown once, stored hashed."""
    if identity.request_peer(request.scope) is None:
        # A stolen token must not be able to mint more of them.
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "tokens are made over the daemon's Unix socket only (GPUMUX_URL=unix:/path)",
        )
    user = token_in.user or caller.name
    if user != caller.name and caller.account.uid != 0:
        # A token is the power to run code as its user: only root may hand out another's.
        log.warning("api: %s may not make a token for %s", caller.name, shown(user))
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"only root makes tokens for other users; {user} can make their own over the socket",
        )
    try:
        account = accounts.UserAccount.from_name(user)
    except accounts.UnknownUser as error:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(error)) from error
    refusal = identity.accepted(account, state.settings, state.daemon_uid)
    if refusal is not None:
        raise HTTPException(status.HTTP_403_FORBIDDEN, refusal)
    with state.sessions.write.begin() as session:
        token = tokens.create_token(session=session, owner_name=user, uid=account.uid)
    log.info("api: %s made a token for %s", caller.name, shown(user))
    return TokenCreated(user=user, token=token)


@router.delete("/tokens/{user}")
def revoke_tokens(user: UserName, state: StateDep, caller: CallerDep) -> TokensRevoked:
    """Revoke every token of a user (their own, or anyone's for an admin)."""
    refuse_unless_owner(caller, user, f"the tokens of {user}")
    with state.sessions.write.begin() as session:
        revoked = tokens.revoke_tokens(session=session, owner_name=user)
    log.info("api: %s revoked %d tokens of %s", caller.name, revoked, shown(user))
    return TokensRevoked(user=user, revoked=revoked)
