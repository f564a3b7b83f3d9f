"""TCP ports on 127.0.0.1 for the daemons and servers the tests start by URL.

A port found by binding port 0 and closing the socket is one of the kernel's ephemeral ports:
under parallel workers (pytest-xdist) two workers can each be handed it before either daemon
binds it, and any process's outgoing connection can take it as its own end meanwhile. These
ports lie below the ephemeral range, which the kernel hands to no one, in a range of their own
per worker, each handed out at most once per worker's run.
"""

from __future__ import annotations

import itertools
import os
import socket

# Where the ports start: below the kernel's ephemeral range (32768 by default on Linux) and
# above the well-known services a developer's machine may run (PostgreSQL's 5432, 8080s).
FIRST = 10_000


def _ephemeral_start() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
        return int(ports.read().split()[0])


def _worker_range() -> range:
    """This worker's share of [FIRST, the ephemeral range); the whole of it without workers."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    span = (_ephemeral_start() - FIRST) // workers
    return range(FIRST + index * span, FIRST + (index + 1) * span)


def _ports() -> itertools.cycle[int]:
    # Starting where this process's pid points: another run beside this one (another
    # checkout's suite) starts elsewhere in the range; a port it holds fails the probe below.
    share = _worker_range()
    start = os.getpid() % len(share)
    return itertools.cycle([*share[start:], *share[:start]])


_next = _ports()


def free_port() -> int:
    """A port nothing listens on now, that no other test of this run is given."""
    for port in itertools.islice(_next, len(_worker_range())):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port left in {_worker_range()}")
