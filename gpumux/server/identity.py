"""Who is asking: the kernel's word for a Unix-socket peer, their account, and what they may do.

On the Unix socket the peer's uid comes from SO_PEERCRED, read when the connection is made:
the kernel records it at connect(), in the daemon's user namespace, so nothing the client
sets (environment, LD_PRELOAD, a user namespace of its own) changes it. Over TCP there is no
such word and requests carry no peer; tokens identify them (gpumux.storage.tokens).
"""

from __future__ import annotations

import asyncio
import errno
import grp
import logging
import os
import pwd
import socket
import stat
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from gpumux.config import Settings

log = logging.getLogger(__name__)

PEER_SCOPE_KEY = "gpumux.peer"

_UCRED = struct.Struct("3i")  # struct ucred: pid_t pid, uid_t uid, gid_t gid

_READ, _EXECUTE = 4, 1


@dataclass(frozen=True)
class PeerCredentials:
    """The process at the other end of a Unix socket, as the kernel saw it at connect()."""

    pid: int
    uid: int
    gid: int


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


class UnknownUser(LookupError):
    """No account on this host has that name or uid."""


@dataclass(frozen=True)
class UserAccount:
    """A local account: the ids a process of that user runs with, and where it lives."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]  # every group it is in, the primary one included, sorted
    home: Path
    shell: str

    @classmethod
    def from_uid(cls, uid: int) -> UserAccount:
        """The account with this uid; UnknownUser when there is none."""
        try:
            entry = pwd.getpwuid(uid)
        except KeyError:
            raise UnknownUser(f"uid {uid} has no account on this host") from None
        return cls._from_entry(entry)

    @classmethod
    def from_name(cls, name: str) -> UserAccount:
        """The account with this name; UnknownUser when there is none."""
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise UnknownUser(f"no user named {name!r} on this host") from None
        return cls._from_entry(entry)

    @classmethod
    def _from_entry(cls, entry: pwd.struct_passwd) -> UserAccount:
        groups = tuple(sorted(set(os.getgrouplist(entry.pw_name, entry.pw_gid))))
        return cls(
            name=entry.pw_name,
            uid=entry.pw_uid,
            gid=entry.pw_gid,
            groups=groups,
            home=Path(entry.pw_dir),
            shell=entry.pw_shell,
        )


# POSIX ACL xattr layout (linux/posix_acl_xattr.h): a version, then (tag, perm, id) entries.
_ACL_XATTR = "system.posix_acl_access"
_ACL_HEADER = struct.Struct("<I")
_ACL_ENTRY = struct.Struct("<HHI")
_ACL_USER_OBJ = 0x01
_ACL_USER = 0x02
_ACL_GROUP_OBJ = 0x04
_ACL_GROUP = 0x08
_ACL_MASK = 0x10
_ACL_OTHER = 0x20


def _acl_entries(path: Path) -> list[tuple[int, int, int]] | None:
    """The access ACL's (tag, perm, id) entries, or None when the mode bits say it all."""
    try:
        raw = os.getxattr(path, _ACL_XATTR)
    except OSError as error:
        if error.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            log.warning("%s: cannot read its ACL (%s); judging by mode bits", path, error)
        return None
    body = raw[_ACL_HEADER.size :]
    if len(raw) < _ACL_HEADER.size or len(body) % _ACL_ENTRY.size:
        log.warning("%s: malformed ACL; judging by mode bits", path)
        return None
    return list(_ACL_ENTRY.iter_unpack(body))


def _acl_grants(
    entries: list[tuple[int, int, int]], info: os.stat_result, account: UserAccount, want: int
) -> bool:
    """The access check of acl(5): owner, named user, groups (any may grant), other."""
    mask = next((perm for tag, perm, _ in entries if tag == _ACL_MASK), 7)
    if account.uid == info.st_uid:
        return any(tag == _ACL_USER_OBJ and perm & want == want for tag, perm, _ in entries)
    for tag, perm, ident in entries:
        if tag == _ACL_USER and ident == account.uid:
            return perm & mask & want == want
    matching = [
        perm & mask
        for tag, perm, ident in entries
        if (tag == _ACL_GROUP_OBJ and info.st_gid in account.groups)
        or (tag == _ACL_GROUP and ident in account.groups)
    ]
    if matching:
        return any(perm & want == want for perm in matching)
    return any(tag == _ACL_OTHER and perm & want == want for tag, perm, _ in entries)


def _grants(path: Path, info: os.stat_result, account: UserAccount, want: int) -> bool:
    """Whether the kernel would give this user `want` (rwx bits) on the file."""
    entries = _acl_entries(path)
    if entries is not None:
        return _acl_grants(entries, info, account, want)
    # Only one class applies, the first that matches: an owner is not saved by the group bits.
    if account.uid == info.st_uid:
        bits = info.st_mode >> 6
    elif info.st_gid in account.groups:
        bits = info.st_mode >> 3
    else:
        bits = info.st_mode
    return bits & want == want


def _describe(path: Path, info: os.stat_result) -> str:
    """Mode, owner and group of a file, as ls shows them."""
    try:
        owner = pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        owner = str(info.st_uid)
    try:
        group = grp.getgrgid(info.st_gid).gr_name
    except KeyError:
        group = str(info.st_gid)
    acl = "+" if _acl_entries(path) is not None else ""
    return f"{stat.filemode(info.st_mode)}{acl} {owner}:{group}"


def _ancestors(path: Path) -> list[Path]:
    """The directories a lookup of `path` passes through: every prefix, as given and resolved."""
    seen: list[Path] = []
    for route in (path, path.resolve()):
        for ancestor in reversed(route.parents):
            if ancestor not in seen:
                seen.append(ancestor)
    return seen


def readable_directory(path: str | os.PathLike[str], account: UserAccount) -> str | None:
    """None when the user may enter and list the directory, else why not.

    Judged without switching to the user: search (x) on every directory on the way, read and
    search on the directory itself, from the mode bits and POSIX access ACLs, as the kernel
    checks them; root passes any directory. NFSv4 ACLs and security modules (SELinux,
    AppArmor) are not considered.
    """
    target = Path(os.path.abspath(path))
    if account.uid != 0:
        # The way there first, as the user would walk it: what lies beyond a directory they
        # cannot search (whether the path exists, what it is) is not theirs to learn.
        for ancestor in reversed(target.parents):
            try:
                ancestor_info = ancestor.stat()
            except OSError:
                return f"{account.name} cannot reach {target}: {ancestor} is not there"
            if not stat.S_ISDIR(ancestor_info.st_mode):
                return f"{account.name} cannot reach {target}: {ancestor} is not a directory"
            if not _grants(ancestor, ancestor_info, account, _EXECUTE):
                return (
                    f"{account.name} cannot reach {target}: no search permission on {ancestor} "
                    f"({_describe(ancestor, ancestor_info)})"
                )
    try:
        info = target.stat()
    except FileNotFoundError:
        return f"{target} does not exist"
    except OSError as error:
        return f"{target} cannot be examined: {error.strerror}"
    if not stat.S_ISDIR(info.st_mode):
        return f"{target} is not a directory"
    if account.uid == 0:
        return None
    for ancestor in _ancestors(target):
        try:
            ancestor_info = ancestor.stat()
        except OSError as error:
            return f"{ancestor} cannot be examined: {error.strerror}"
        if not _grants(ancestor, ancestor_info, account, _EXECUTE):
            return (
                f"{account.name} cannot reach {target}: no search permission on {ancestor} "
                f"({_describe(ancestor, ancestor_info)})"
            )
    if not _grants(target, info, account, _READ | _EXECUTE):
        return f"{account.name} cannot enter and list {target} ({_describe(target, info)})"
    return None


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
