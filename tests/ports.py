"""TCP ports on 127.0.0.1 for the daemons and servers the tests start by URL.

A port found by binding port 0 and closing the socket is one of the kernel's ephemeral ports:
under parallel workers (pytest-xdist) two workers can each be handed it before either daemon
binds it, and any process's outgoing connection can take it as its own end meanwhile. These
ports lie outside the ephemeral range where the host leaves room (below it by default), in a
range of their own per worker, each handed out at most once per worker's run.
"""

from __future__ import annotations

import itertools
import os
import socket

# Where the ports start: above the well-known services a developer's machine may run
# (PostgreSQL's 5432, 8080s); the kernel's ephemeral range starts at 32768 by default.
FIRST = 10_000


# The fewest ports a run needs for the daemons it starts (about 400 in the whole suite).
ENOUGH = 1_000


def _unhanded() -> range:
    """Ports the kernel hands out as no one's outgoing end: below its ephemeral range, else
    above it; on a host that made nearly every port ephemeral, all from FIRST up, where the
    probe in free_port must do."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
        low, high = (int(word) for word in ports.read().split())
    if low - FIRST >= ENOUGH:
        return range(FIRST, low)
    if 65_535 - high >= ENOUGH:
        return range(high + 1, 65_536)
    return range(FIRST, 65_536)


def _worker_range() -> range:
    """This worker's share of the unhanded ports; the whole of them without workers."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    ports = _unhanded()
    span = len(ports) // workers
    return ports[index * span : (index + 1) * span]


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
