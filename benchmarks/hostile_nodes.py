"""The daemons of benchmarks/hostile.py and the /health poller that times them.

Each node is a root `gpumux serve` on 127.0.0.1 (TCP: the users' tokens) and on a Unix socket
(where root makes those tokens); the poller asks GET /health every `interval` seconds whether
or not the previous answer came (over at most CONNECTIONS connections), so that a stall of the
daemon counts once per tick it lasts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from nodes import free_port

START_TIMEOUT_S = 30.0
# Requests to /health at once, per node, at the most.
CONNECTIONS = 4


@dataclass
class Node:
    """One `gpumux serve` over its data directory, started, stopped and killed on demand."""

    name: str
    home: Path
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def uds(self) -> Path:
        return self.home.with_name(self.name + ".sock")

    @property
    def log_path(self) -> Path:
        return self.home.with_name(self.name + ".log")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> float:
        """Start it (again); the seconds until it answered /health (RuntimeError past
        START_TIMEOUT_S, the daemon left running)."""
        command = [sys.executable, "-m", "gpumux", "serve", "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--uds", str(self.uds)]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        began = time.monotonic()
        with httpx.Client(base_url=self.url, timeout=5) as client:
            while True:
                if not self.running:
                    raise RuntimeError(f"{self.name} exited at start")
                with contextlib.suppress(httpx.TransportError):
                    if client.get("/health").status_code == 200:
                        return time.monotonic() - began
                if time.monotonic() > began + START_TIMEOUT_S:
                    raise RuntimeError(f"{self.name} did not answer in {START_TIMEOUT_S:g} s")
                time.sleep(0.1)

    def stop(self, timeout: float) -> float | None:
        """SIGTERM, then SIGKILL after `timeout`: the seconds it took to exit, None if it
        ignored SIGTERM."""
        if not self.running:
            return 0.0
        assert self.process is not None
        began = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        return time.monotonic() - began

    def kill(self) -> None:
        """SIGKILL: a crash, its supervisors left to run on."""
        if self.running:
            assert self.process is not None
            self.process.kill()
            self.process.wait()

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def make_token(self, user: str) -> str:
        """A token for `user`, made by root over the Unix socket."""
        transport = httpx.HTTPTransport(uds=str(self.uds))
        with httpx.Client(transport=transport, base_url="http://gpumux", timeout=30) as client:
            made = client.post("/tokens", json={"user": user})
        made.raise_for_status()
        return str(made.json()["token"])


def make_nodes(count: int, root: Path, env: dict[str, str]) -> list[Node]:
    """`count` nodes, each its own data directory under `root` and name."""
    nodes = []
    for index in range(count):
        home = root / f"node{index}"
        home.mkdir(mode=0o700)
        base = {name: value for name, value in os.environ.items() if not name.startswith("GPUMUX_")}
        node_env = base | env | {"GPUMUX_HOME": str(home), "GPUMUX_NODE_NAME": f"node{index}"}
        nodes.append(Node(name=f"node{index}", home=home, env=node_env))
    return nodes


@dataclass
class HealthPoller:
    """GET /health on one node every `interval` s, each answer timed from when it was due (a
    timeout as at least `timeout`)."""

    url: str
    interval: float
    timeout: float
    seconds: list[float] = field(default_factory=list)
    timeouts: int = 0
    failures: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=asyncio.run, args=(self._poll(),), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop asking; the answers still awaited are waited for (at most `timeout`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    async def _poll(self) -> None:
        # A few clients' worth of connections: a stalled daemon is not sent hundreds of
        # requests at once (each would hold one of its database connections); a request
        # waiting for a free connection counts that wait, from when it was due.
        limits = httpx.Limits(max_connections=CONNECTIONS, max_keepalive_connections=CONNECTIONS)
        async with httpx.AsyncClient(
            base_url=self.url, timeout=self.timeout, limits=limits
        ) as client:
            asking: set[asyncio.Task[None]] = set()
            due = time.monotonic()
            while not self._stop.is_set():
                task = asyncio.create_task(self._ask(client))
                asking.add(task)
                task.add_done_callback(asking.discard)
                due += self.interval
                await asyncio.sleep(max(0.0, due - time.monotonic()))
            await asyncio.gather(*asking)

    async def _ask(self, client: httpx.AsyncClient) -> None:
        began = time.monotonic()
        try:
            answer = await client.get("/health")
        except httpx.TimeoutException:
            self.timeouts += 1
            self.seconds.append(max(self.timeout, time.monotonic() - began))
            return
        except httpx.TransportError:
            self.failures += 1
        else:
            self.failures += answer.status_code != 200
        self.seconds.append(time.monotonic() - began)


def latency_figures(pollers: list[HealthPoller]) -> dict[str, Any]:
    """Over every node's answers: how many, p50, p99 and worst in ms, timeouts, failures."""
    seconds = sorted(s for poller in pollers for s in poller.seconds)
    if len(seconds) < 2:
        return {"requests": len(seconds)}
    percentiles = statistics.quantiles(seconds, n=100, method="inclusive")
    return {
        "requests": len(seconds),
        "p50_ms": round(percentiles[49] * 1000, 1),
        "p99_ms": round(percentiles[98] * 1000, 1),
        "worst_ms": round(seconds[-1] * 1000, 1),
        "timeouts": sum(poller.timeouts for poller in pollers),
        "failures": sum(poller.failures for poller in pollers),
    }
