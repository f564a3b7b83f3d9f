"""Who is asking: the kernel's word for a Unix-socket peer, their account, and what they may do.

On the Unix socket the peer's uid comes from SO_PEERCRED, read when the connection is made:
the kernel records it at connect(), in the daemon's user namespace, so nothing the client
sets (environment, LD_PRELOAD, a user namespace of its own) changes it. Over TCP there is no
such word and requests carry no peer; tokens identify them (gpumux.storage.tokens).
"""

from __future__ import annotations

import asyncio
import grp
import logging
import pwd
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from gpumux.config import Settings
from gpumux.home.accounts import UserAccount

log = logging.getLogger(__name__)

PEER_SCOPE_KEY = "gpumux.peer"

_UCRED = struct.Struct("3i")  # struct ucred: pid_t pid, uid_t uid, gid_t gid


@dataclass(frozen=True)
class PeerCredentials:
    """The process at the other end of a Unix socket, as the kernel saw it at connect()."""

    pid: int
    uid: int
    gid: int


def credentials(authorization: str | None, scheme: str) -> str | None:
    """What an Authorization header carries after `scheme` (matched in any case, RFC 9110), or
    None when it names another scheme or nothing."""
    given, _, rest = (authorization or "").strip().partition(" ")
    return (rest.strip() or None) if given.lower() == scheme.lower() else None


def peer_credentials(sock: socket.socket) -> PeerCredentials:
    """The peer's pid, uid and gid of a connected Unix socket (SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return PeerCredentials(pid=pid, uid=uid, gid=gid)


def request_peer(scope: Mapping[str, Any]) -> PeerCredentials | None:
    """The credentials of the Unix-socket peer that sent this request; None over TCP."""
    peer = scope.get(PEER_SCOPE_KEY)
    return peer if isinstance(peer, PeerCredentials) else None


class _WithPeer:
    """An ASGI app that adds one connection's peer credentials to each request's scope."""

    def __init__(self, app: Any, peer: PeerCredentials) -> None:
        self.app = app
        self.peer = peer

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        scope[PEER_SCOPE_KEY] = self.peer
        await self.app(scope, receive, send)


def _app_for_connection(app: Any, transport: asyncio.BaseTransport) -> Any:
    """The app as one connection serves it: tagged with the peer when it is a Unix socket."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family != socket.AF_UNIX:
        return app
    try:
        peer = peer_credentials(sock)
    except OSError as error:
        # Without the kernel's word the request is anonymous: a token must identify it.
        log.warning("connection: cannot read the peer's credentials: %s", error)
        return app
    return _WithPeer(app, peer)


class PeerH11Protocol(H11Protocol):
    """uvicorn's h11 protocol; requests on a Unix socket carry the peer's credentials."""

    # Narrower than asyncio's BaseTransport, as in uvicorn's own override.
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # One protocol instance per connection: its own `app` serves only this peer.
        self.app = _app_for_connection(self.app, transport)
        super().connection_made(transport)


PeerHttpProtocol: type[asyncio.Protocol]
try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # uvicorn without its "standard" extra: h11 is what "auto" would use too
    PeerHttpProtocol = PeerH11Protocol
else:

    class PeerHttpToolsProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol; requests on a Unix socket carry the peer's credentials."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self.app = _app_for_connection(self.app, transport)
            super().connection_made(transport)

    PeerHttpProtocol = PeerHttpToolsProtocol


def _names(text: str) -> set[str]:
    """The names in a comma list, blanks dropped."""
    return {name.strip() for name in text.split(",") if name.strip()}


def is_admin(account: UserAccount, settings: Settings) -> bool:
    """Whether the user sees and controls everyone's work: named in admins, or in admin_group."""
    if account.name in _names(settings.admins):
        return True
    if not settings.admin_group:
        return False
    try:
        gid = grp.getgrnam(settings.admin_group).gr_gid
    except KeyError:
        return False
    return gid in account.groups


def accepted(account: UserAccount, settings: Settings, daemon_uid: int) -> str | None:
    """None when this daemon may serve the user, else why not.

    A daemon running as root serves everyone (their trials run as them); any other serves
    its own user and the users named in accept_users (their trials run as the daemon's user).
    """
    if daemon_uid == 0 or account.uid == daemon_uid:
        return None
    if account.name in _names(settings.accept_users):
        return None
    try:
        daemon_user = pwd.getpwuid(daemon_uid).pw_name
    except KeyError:
        daemon_user = f"uid {daemon_uid}"
    return (
        f"this gpumux daemon runs as {daemon_user} and does not serve {account.name}: "
        f"{daemon_user} can add {account.name} to GPUMUX_ACCEPT_USERS, or start your own "
        "daemon (gpumux serve)"
    )
