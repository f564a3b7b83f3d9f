"""Dependencies shared by the routes: sessions, settings, and who is asking."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Query, Request, status
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session

from gpumux.config import Settings
from gpumux.devices.snapshot import DeviceSnapshot
from gpumux.fields import MAX_ID, MAX_USER_CHARS
from gpumux.home import accounts
from gpumux.server import identity
from gpumux.server.api.forward import NodeClient
from gpumux.server.api.shown import shown
from gpumux.storage import tokens
from gpumux.storage.budget import ReportBudget
from gpumux.storage.engine import Sessions
from gpumux.storage.models import utcnow
from gpumux.storage.nodes import NodeIdentity

log = logging.getLogger(__name__)

SweepId = Annotated[int, Path(ge=1, le=MAX_ID, description="the sweep's id")]
TrialId = Annotated[int, Path(ge=1, le=MAX_ID, description="the trial's id")]
ProfileId = Annotated[int, Path(ge=1, le=MAX_ID, description="the profile's id")]
Offset = Annotated[int, Query(ge=0, le=MAX_ID, description="how many to skip")]
UserName = Annotated[str, Path(min_length=1, max_length=MAX_USER_CHARS, description="a user")]


@dataclass(frozen=True)
class AppState:
    settings: Settings
    sessions: Sessions
    devices_view: Callable[[], list[DeviceSnapshot]]
    notify: Callable[[], None]
    # What each trial's reports may cost, shared with the scheduler's report lines.
    budget: ReportBudget
    daemon_uid: int = field(default_factory=os.geteuid)
    # The node this daemon joined as; None for an app served without a scheduler (tests).
    node: NodeIdentity | None = None
    # What asks other nodes for the logs of their trials.
    node_client: NodeClient = field(default_factory=NodeClient)


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.gpumux
    return state


StateDep = Annotated[AppState, Depends(get_state)]


def get_read_session(state: StateDep) -> Generator[Session, None, None]:
    session = state.sessions.read()
    try:
        yield session
    finally:
        try:
            session.close()
        except DBAPIError as error:
            # Closing rolls back: a server gone since the session's query fails that too, after
            # the request's answer (a 503 where the query failed). A read loses nothing by it.
            if not state.sessions.dialect.is_unreachable(error):
                raise


ReadSessionDep = Annotated[Session, Depends(get_read_session)]


@dataclass(frozen=True)
class Caller:
    """Who sent the request, as the kernel (Unix socket) or their token (TCP) says."""

    account: accounts.UserAccount
    admin: bool

    @property
    def name(self) -> str:
        return self.account.name

    def may_touch(self, owner: str) -> bool:
        """Whether this caller may see and control work that `owner` submitted."""
        return self.admin or owner == self.account.name


def get_caller(request: Request, state: StateDep) -> Caller:
    """Identify the caller: SO_PEERCRED on the Unix socket, a token over TCP; never the body."""
    peer = identity.request_peer(request.scope)
    try:
        if peer is not None:
            account = accounts.UserAccount.from_uid(peer.uid)
        else:
            account = _account_of_token(request, state)
    except accounts.UnknownUser as error:
        raise HTTPException(status.HTTP_403_FORBIDDEN, str(error)) from error
    refusal = identity.accepted(account, state.settings, state.daemon_uid)
    if refusal is not None:
        log.warning("api: refused %s (uid %d): %s", account.name, account.uid, refusal)
        raise HTTPException(status.HTTP_403_FORBIDDEN, refusal)
    admin = account.uid in (0, state.daemon_uid) or identity.is_admin(account, state.settings)
    return Caller(account=account, admin=admin)


def _account_of_token(request: Request, state: AppState) -> accounts.UserAccount:
    token = identity.credentials(request.headers.get("authorization"), "Bearer")
    if token is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "over TCP every request needs a token (Authorization: Bearer ...): get one with "
            "`gpumux token create` over the daemon's Unix socket, or use the socket",
            headers={"WWW-Authenticate": "Bearer"},
        )
    now = utcnow()
    with state.sessions.read() as session:
        row = tokens.find_token(session=session, token=token)
        if row is not None:
            name, token_id, due = row.owner.name, row.id, tokens.use_is_due(row, now)
    if row is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "the token is unknown or revoked: get a new one with `gpumux token create`",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if due:
        # Bookkeeping only: a busy or full database must not refuse the request for it.
        try:
            with state.sessions.write.begin() as session:
                tokens.note_use(session=session, token_id=token_id, now=now)
        except OperationalError as error:
            log.warning("api: token use not recorded: %s", error)
    return accounts.UserAccount.from_name(name)


CallerDep = Annotated[Caller, Depends(get_caller)]


def refuse_unless_owner(caller: Caller, owner: str, what: str) -> None:
    """403 (and a log line) when the caller may not touch another user's work."""
    if not caller.may_touch(owner):
        log.warning("api: %s may not touch %s of %s", caller.name, shown(what), shown(owner))
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"{what} belongs to another user")
