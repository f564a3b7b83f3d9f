"""Load on the REST API: N concurrent clients submit and list sweeps against a real daemon.

Prints the command line, the machine, then requests/s and p50/p99 latency per endpoint.
Without --url it starts its own `gpumux serve` on a free port with a fresh database in a
temporary directory. The submitted sweeps run `true`, so the daemon launches their trials
while it serves the load, as it would in use.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gpumux import __version__
from gpumux.home import tokenfile

STARTUP_DEADLINE_S = 60.0
ENDPOINTS = (
    "POST /sweeps",
    "GET /sweeps",
    "GET /sweeps/{id}",
    "GET /sweeps/{id}/trials",
    "GET /health",
)
# With --preload: a page from the middle of the big sweep, and its failed trials.
BIG_ENDPOINTS = ("GET /sweeps/{big}/trials?offset=half", "GET /sweeps/{big}/trials?status=failed")


@dataclass
class Samples:
    """Latencies (seconds) and error counts per endpoint."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: Counter[str] = field(default_factory=Counter)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percentile(ordered: list[float], q: float) -> float:
    """The nearest-rank percentile q (0-100) of sorted values."""
    rank = max(1, round(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@contextlib.contextmanager
def own_daemon(max_grid: int) -> Iterator[str]:
    """`gpumux serve` on a free port with a database in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="gpumux-load-") as home:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {name: value for name, value in os.environ.items() if not name.startswith("GPUMUX_")}
        env.update(GPUMUX_HOME=home, GPUMUX_KILL_GRACE="2", GPUMUX_MAX_GRID=str(max_grid))
        command = [sys.executable, "-m", "gpumux", "serve", "--port", str(port)]
        with open(Path(home) / "serve.log", "w") as log:
            daemon = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                wait_for_health(url, daemon)
                # Over TCP every request needs a token: the one this daemon keeps for its user.
                os.environ["GPUMUX_TOKEN"] = tokenfile.daemon_token(Path(home)) or ""
                yield url
            finally:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(timeout=STARTUP_DEADLINE_S)


def wait_for_health(url: str, daemon: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    with httpx.Client(base_url=url, timeout=5) as http:
        while time.monotonic() < deadline:
            if daemon.poll() is not None:
                raise SystemExit(f"gpumux serve exited with {daemon.returncode} before answering")
            with contextlib.suppress(httpx.TransportError):
                if http.get("/health").is_success:
                    return
            time.sleep(0.05)
    raise SystemExit(f"gpumux serve did not answer at {url} within {STARTUP_DEADLINE_S:g} s")


def auth() -> dict[str, str]:
    """The token header a gpumux client would send (GPUMUX_TOKEN or the user's token file)."""
    token = tokenfile.discover_token()
    return {"Authorization": f"Bearer {token}"} if token else {}


def sweep_body(workdir: str) -> dict[str, Any]:
    return {
        "params": ["x=1,2"],
        "command": ["true"],
        "workdir": workdir,
        "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    }


def preload(url: str, trials: int, workdir: str) -> int:
    """A sweep of `trials` trials, cancelled at once so that its rows stay and nothing runs."""
    with httpx.Client(base_url=url, timeout=600, headers=auth()) as http:
        body = sweep_body(workdir) | {"params": [f"n=1..{trials}"]}
        started = time.perf_counter()
        created = http.post("/sweeps", json=body)
        created.raise_for_status()
        sweep_id = int(created.json()["id"])
        http.post(f"/sweeps/{sweep_id}/cancel").raise_for_status()
        while http.get(f"/sweeps/{sweep_id}").json()["status"] != "cancelled":
            time.sleep(0.1)
        took = time.perf_counter() - started
        print(f"preloaded sweep {sweep_id}: {trials:,} trials stored in {took:.1f} s")
        return sweep_id


async def one_client(
    url: str, requests: int, samples: Samples, workdir: str, big: tuple[int, int] | None
) -> None:
    """Cycle through the endpoints `requests` times, recording each latency."""
    endpoints = ENDPOINTS + (BIG_ENDPOINTS if big else ())
    async with httpx.AsyncClient(base_url=url, timeout=60, headers=auth()) as http:
        await http.get("/health")  # connect before the clock starts
        sweep_id: int | None = None
        for number in range(requests):
            endpoint = endpoints[number % len(endpoints)]
            if sweep_id is None:
                endpoint = ENDPOINTS[0]
            method, template = endpoint.split(" ")
            path, _, query = template.partition("?")
            path = path.replace("{id}", str(sweep_id))
            params: dict[str, Any] = {"limit": 20} if path == "/sweeps" else {}
            if big is not None:
                path = path.replace("{big}", str(big[0]))
                params |= {"offset": big[1] // 2} if query == "offset=half" else {}
                params |= {"status": "failed", "limit": 100} if query == "status=failed" else {}
            start = time.perf_counter()
            if method == "POST":
                response = await http.post(path, json=sweep_body(workdir))
            else:
                response = await http.get(path, params=params)
            samples.latencies[endpoint].append(time.perf_counter() - start)
            if response.is_error:
                samples.errors[endpoint] += 1
            elif method == "POST":
                sweep_id = int(response.json()["id"])


async def load(
    url: str, clients: int, requests: int, workdir: str, big: tuple[int, int] | None
) -> tuple[Samples, float]:
    samples = Samples()
    start = time.perf_counter()
    await asyncio.gather(
        *(one_client(url, requests, samples, workdir, big) for _ in range(clients))
    )
    return samples, time.perf_counter() - start


def report(samples: Samples, seconds: float, clients: int) -> None:
    total = sum(len(values) for values in samples.latencies.values())
    errors = sum(samples.errors.values())
    print(
        f"{total} requests from {clients} concurrent clients in {seconds:.2f} s: "
        f"{total / seconds:.0f} requests/s, {errors} errors\n"
    )
    print("| endpoint | requests | errors | requests/s | p50 ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for endpoint in ENDPOINTS + BIG_ENDPOINTS:
        values = sorted(samples.latencies.get(endpoint, []))
        if not values:
            continue
        print(
            f"| {endpoint} | {len(values)} | {samples.errors[endpoint]} "
            f"| {len(values) / seconds:.0f} | {percentile(values, 50) * 1000:.1f} "
            f"| {percentile(values, 99) * 1000:.1f} | {values[-1] * 1000:.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument("--requests", type=int, default=100, help="requests per client")
    parser.add_argument("--url", help="an existing daemon (default: start one here)")
    parser.add_argument(
        "--preload", type=int, default=0, help="first store one sweep of this many trials"
    )
    args = parser.parse_args()
    if args.clients < 1 or args.requests < 1:
        parser.error("--clients and --requests must be at least 1")
    print(f"$ {shlex.join(sys.orig_argv)}")
    usable = len(os.sched_getaffinity(0))
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores "
        f"({usable} usable by this process), Python {platform.python_version()}, "
        f"gpumux {__version__}"
    )
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(own_daemon(max(10_000, args.preload)))
        where = "an existing daemon" if args.url else "gpumux serve started by this script"
        print(f"daemon: {url} ({where}; load generator and daemon share the cores)")
        workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="gpumux-load-work-"))
        big = (preload(url, args.preload, workdir), args.preload) if args.preload else None
        print()
        samples, seconds = asyncio.run(load(url, args.clients, args.requests, workdir, big))
    report(samples, seconds, args.clients)


if __name__ == "__main__":
    main()
