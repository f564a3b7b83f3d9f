"""Where the daemon listens: its Unix socket (who connects is told by the kernel), TCP beside
it or instead (requests carry a token), and the address the CLI will look for."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

from gpumux.config import Settings
from gpumux.home.lockfile import DaemonError

UNIX_PATH_MAX = 108  # sun_path in struct sockaddr_un, with its terminating NUL


def serves_other_users(settings: Settings) -> bool:
    """Whether other users may connect to the socket: a daemon run by root serves every user,
    an ordinary one those it is told to accept; a socket in the data directory, its owner."""
    if settings.uds is None:
        return False
    shared = os.geteuid() == 0 or bool(settings.accept_users.strip())
    return shared and not settings.uds.resolve().is_relative_to(settings.home.resolve())


def wants_tcp(settings: Settings) -> bool:
    """TCP when no socket is named, or beside it when a host or port is asked for too."""
    return settings.uds is None or bool({"host", "port"} & settings.model_fields_set)


def bind(
    settings: Settings, *, fallback_port: bool = False, shared: bool = False
) -> list[tuple[socket.socket, str]]:
    """The listening sockets, each with the URL clients use to reach it: the Unix socket
    first (trials report there), then TCP. A `shared` Unix socket is open to every user (the
    kernel tells who connects); TCP requests need a token."""
    listeners = []
    try:
        if settings.uds is not None:
            listeners.append(bind_unix(settings.uds, shared=shared))
        if wants_tcp(settings):
            listeners.append(bind_tcp(settings, fallback_port=fallback_port))
    except BaseException:
        for sock, _ in listeners:
            sock.close()
        raise
    return listeners


def bind_unix(path: Path, *, shared: bool) -> tuple[socket.socket, str]:
    """A listening Unix socket at `path` (0600, or 0666 when shared)."""
    # Before the unlink: a path too long for a socket may be too long for a file name too.
    if len(os.fsencode(path)) >= UNIX_PATH_MAX:
        raise DaemonError(
            f"socket path {path} is too long for a Unix socket ({UNIX_PATH_MAX - 1} bytes at "
            "most); set GPUMUX_URL=unix:/a/shorter/path, or serve over TCP with --port"
        )
    try:
        path.unlink()  # we hold the lock, so a socket file left here is stale
    except FileNotFoundError:
        pass
    except OSError as error:
        # A directory there, or one this user may not write to.
        raise DaemonError(
            f"cannot listen on the socket {path}: {error.strerror}; choose another with --uds "
            "or GPUMUX_URL"
        ) from error
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # Created 0600 from the start: no moment in which another user could connect.
    previous = os.umask(0o177)
    try:
        sock.bind(str(path))
    except OSError as error:
        sock.close()
        raise DaemonError(
            f"cannot listen on the socket {path}: {error.strerror}; create its directory "
            "(writable by this user) or choose another with --uds or GPUMUX_URL"
        ) from error
    finally:
        os.umask(previous)
    if shared:
        # Anyone may connect: the kernel tells the daemon who they are (SO_PEERCRED).
        os.chmod(path, 0o666)
    sock.listen(128)
    return sock, f"unix:{path}"


def bind_tcp(settings: Settings, *, fallback_port: bool) -> tuple[socket.socket, str]:
    """A listening TCP socket at settings.host:port (any free port if taken and allowed)."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    # IPPROTO_TCP named, so that asyncio sets TCP_NODELAY on each accepted connection: without
    # it a response written in two pieces waits for the client's delayed ACK (40 ms a request).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((settings.host, settings.port))
    except OSError as error:
        if error.errno != errno.EADDRINUSE or not fallback_port:
            sock.close()
            raise DaemonError(
                f"cannot listen on {settings.host}:{settings.port}: {error.strerror}; "
                "pick another with --port"
            ) from error
        sock.bind((settings.host, 0))
    sock.listen(128)
    host, port = sock.getsockname()[:2]
    host = f"[{host}]" if family == socket.AF_INET6 else host
    return sock, f"http://{host}:{port}"


def listen_where_clients_look(settings: Settings) -> Settings:
    """Settings that make a daemon listen at settings.url, where the CLI looks for one."""
    if settings.url.startswith("unix:"):
        return settings.model_copy(update={"uds": Path(settings.url.removeprefix("unix:"))})
    address = urlsplit(settings.url)
    if address.scheme != "http" or address.hostname is None:
        raise DaemonError(f"GPUMUX_URL {settings.url!r} must be http://HOST:PORT or unix:/PATH")
    return settings.model_copy(
        update={"host": address.hostname, "port": address.port or 80, "uds": None}
    )
