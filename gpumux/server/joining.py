"""A daemon's entry into its database once it listens: its node joined (with the URL other
nodes reach it at), and a token for its own user."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy.exc import OperationalError

from gpumux.config import Settings
from gpumux.home import accounts, tokenfile
from gpumux.home.lockfile import DaemonError
from gpumux.processes import rundir
from gpumux.scheduling.heartbeat import record_lease
from gpumux.storage import membership, tokens
from gpumux.storage.engine import Sessions
from gpumux.storage.nodes import NodeIdentity

log = logging.getLogger(__name__)

# Addresses that listen on every interface: no other host can connect to them as written.
WILDCARDS = {"0.0.0.0", "::"}


def tcp_url(urls: list[str]) -> str | None:
    """Where other nodes reach a daemon listening at `urls`, None when it serves no TCP: a
    wildcard address (0.0.0.0, ::) is this host's name to them."""
    url = next((url for url in urls if url.startswith("http")), None)
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.hostname in WILDCARDS:
        return urlunsplit(parts._replace(netloc=f"{socket.getfqdn()}:{parts.port}"))
    return url


def join(
    settings: Settings, sessions: Sessions, *, url: str | None, database: str
) -> NodeIdentity | None:
    """Join the nodes of this database (one on SQLite); a name another live daemon holds
    is refused with what to do. On a full disk the one daemon of an SQLite file serves
    unrecorded (None: it owns every trial, as before nodes), so that it still serves what
    it has; on a shared database a node must be recorded to claim anything."""
    dialect = sessions.dialect
    renewed_at = rundir.boottime()
    try:
        with sessions.write.begin() as session:
            node = membership.join(
                session=session,
                name=settings.node_name,
                home=membership.home_id(settings.home),
                url=url,
                pid=os.getpid(),
                lease_s=settings.node_lease,
                lost_retries=settings.lost_retries,
            )
    except membership.NodeNameTaken as error:
        raise DaemonError(str(error)) from error
    except OperationalError as error:
        if dialect.shared or not dialect.is_full(error):
            raise
        log.warning(
            "node %s: not recorded: the disk is full (%s); serving as the one daemon of %s",
            settings.node_name,
            error.orig,
            database,
        )
        return None
    record_lease(settings, sessions, renewed_at=renewed_at)
    return node


def own_token(settings: Settings, sessions: Sessions) -> None:
    """A token for the daemon's own user, kept in its data directory, so that the CLI of
    that user can reach it over TCP without a `gpumux token create`."""
    path = settings.layout.daemon_token
    with contextlib.suppress(tokenfile.TokenFileError):
        kept = tokenfile.read_token_file(path)
        if kept is not None:
            with sessions.write.begin() as session:
                if tokens.resolve_token(session=session, token=kept) is not None:
                    return
    account = accounts.UserAccount.from_uid(os.geteuid())
    try:
        with sessions.write.begin() as session:
            token = tokens.create_token(session=session, owner_name=account.name, uid=account.uid)
        tokenfile.write_token_file(path, token)
    except (OSError, OperationalError) as error:
        # Only TCP clients of this user need it; the daemon serves on without.
        log.warning("daemon: no token for %s in %s: %s", account.name, path, error)
