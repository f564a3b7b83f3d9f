"""Several node daemons on one PostgreSQL under faults: is every trial run once, and how fast
does the cluster claim?

    python benchmarks/nodes.py [--trials 2000] [--nodes 3] [--split 8] [--faults 6]

Two parts, on this machine (a throwaway PostgreSQL cluster from Debian's server binaries, as
the tests start one; each node a `gpumux serve` with its own data directory and node name):
- faults: a sweep of `trials` short trials (a shell that writes its trial id, attempt and the
  time to a ledger as it starts, every 0.1 s of the `--duration` s it sleeps, and as it ends)
  while, at random moments, a node's daemon is killed with SIGKILL (and started again after
  its lease lapsed) or frozen with SIGSTOP past its lease (then thawed). Prints trials
  submitted, succeeded, requeued (attempt > 1), lost (not succeeded: must be 0), run twice
  (an attempt that started before an earlier attempt of the same trial ended: must be 0),
  redone (two attempts that both ran to their end: the first ended while its daemon was dead,
  so its end was never recorded and the trial ran again once its node's lease lapsed) and
  orphans (trial processes alive once every node stopped: must be 0).
- claims: the same sweep with no faults, on `nodes` nodes sharing PostgreSQL and on one node
  with SQLite, interleaved `--repeats` times: trials started per second across the cluster.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from gpumux.home import tokenfile

ROOT = Path(__file__).resolve().parents[1]
# The tests' throwaway cluster (initdb on a Unix socket, as postgres when root), reused here.
sys.path.insert(0, str(ROOT / "tests"))
from postgres import Cluster, start_cluster, unavailable  # noqa: E402

console = Console(soft_wrap=True)
HEARTBEAT_S = 1.0
# How often a trial of the fault run says it is alive: an attempt that lives on past the start
# of the next one is seen within this much.
TICK_S = 0.1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Node:
    """One node daemon: its data directory, port and process."""

    name: str
    home: Path
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        log = open(self.home / "daemon.log", "ab")  # noqa: SIM115 - the daemon keeps it
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpumux", "serve", "--port", str(self.port)],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        with httpx.Client(base_url=self.url, timeout=10) as client:
            wait_until(lambda: healthy(client), what=f"{self.name} to answer")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=120)


def healthy(client: httpx.Client) -> bool:
    try:
        return client.get("/health").status_code == 200
    except httpx.TransportError:
        return False


def wait_until(condition: object, *, what: str, timeout: float = 60.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def make_nodes(count: int, root: Path, database_url: str, lease_s: float) -> list[Node]:
    nodes = []
    for index in range(count):
        home = root / f"node{index}"
        home.mkdir(mode=0o700)
        env = os.environ | {
            "GPUMUX_HOME": str(home),
            "GPUMUX_DATABASE_URL": database_url,
            "GPUMUX_NODE_NAME": f"node{index}",
            "GPUMUX_NODE_LEASE": str(lease_s),
            "GPUMUX_NODE_HEARTBEAT": str(HEARTBEAT_S),
        }
        nodes.append(Node(name=f"node{index}", home=home, env=env))
    return nodes


def submit(node: Node, trials: int, split: int, ledger: Path, duration: float) -> tuple[int, str]:
    mark = f'echo "$GPUMUX_TRIAL_ID $GPUMUX_ATTEMPT $(date +%s.%N)" >> {ledger}'
    ticks = " ".join(str(tick) for tick in range(round(duration / TICK_S)))
    script = f"{mark} start; for t in {ticks}; do sleep {TICK_S}; {mark} alive; done; {mark} end"
    token = tokenfile.daemon_token(node.home)
    assert token is not None, f"{node.name} wrote no token in {node.home}"
    with httpx.Client(base_url=node.url, timeout=30) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        answer = client.post(
            "/sweeps",
            json={
                "params": [f"n=1..{trials}"],
                "command": ["/bin/sh", "-c", script],
                "workdir": str(ROOT),
                "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                "split": split,
            },
        )
        answer.raise_for_status()
    return int(answer.json()["id"]), token


def trial_rows(url: str, token: str, sweep_id: int, trials: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with httpx.Client(base_url=url, timeout=30) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        for offset in range(0, trials, 1000):
            page = client.get(
                f"/sweeps/{sweep_id}/trials", params={"offset": offset, "limit": 1000}
            )
            page.raise_for_status()
            rows.extend(page.json()["data"])
    return rows


def sweep_done(url: str, token: str, sweep_id: int) -> bool:
    try:
        with httpx.Client(base_url=url, timeout=10) as client:
            client.headers["Authorization"] = f"Bearer {token}"
            return bool(client.get(f"/sweeps/{sweep_id}").json()["status"] == "finished")
    except httpx.TransportError:
        return False


def inject_faults(
    nodes: list[Node], count: int, lease_s: float, done: object, rng: random.Random
) -> list[str]:
    """SIGKILL or SIGSTOP a random node at random moments until `count` faults or the end."""
    assert callable(done)
    events = []
    for _ in range(count):
        time.sleep(rng.uniform(1.0, 4.0))
        if done():
            break
        node = rng.choice(nodes)
        assert node.process is not None
        if rng.random() < 0.5:
            node.process.kill()
            node.process.wait()
            events.append(f"SIGKILL {node.name}")
            time.sleep(lease_s * 1.5)
            node.start()
        else:
            node.process.send_signal(signal.SIGSTOP)
            events.append(f"SIGSTOP {node.name}")
            time.sleep(lease_s * 1.5)
            node.process.send_signal(signal.SIGCONT)
    return events


def orphans(ledger: Path) -> int:
    """Processes still running a trial of this run (their command line names the ledger)."""
    count = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(ledger).encode() in command and b"sleep" in command:
            count += 1
    return count


def overlaps(ledger: str) -> tuple[int, int]:
    """From the ledger: trials an attempt of which was seen alive after a later attempt of
    theirs started (ran beside it), and trials two of whose attempts ran to their end."""
    seen: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    ended: dict[str, set[int]] = defaultdict(set)
    for line in ledger.splitlines():
        trial, attempt, moment, what = line.split()
        seen[trial][int(attempt)].append(float(moment))
        if what == "end":
            ended[trial].add(int(attempt))
    beside = sum(
        any(
            max(attempts[earlier]) > min(attempts[later])
            for earlier in attempts
            for later in attempts
            if later > earlier
        )
        for attempts in seen.values()
    )
    return beside, sum(len(attempts) > 1 for attempts in ended.values())


def fault_run(cluster: Cluster, args: argparse.Namespace, rng: random.Random) -> None:
    database = cluster.create_database()
    with tempfile.TemporaryDirectory(prefix="gpumux-nodes-") as scratch:
        root = Path(scratch)
        ledger = root / "ledger"
        ledger.touch()
        nodes = make_nodes(args.nodes, root, cluster.url(database), args.lease)
        try:
            for node in nodes:
                node.start()
            sweep_id, token = submit(nodes[0], args.trials, args.split, ledger, args.duration)
            began = time.monotonic()

            def done() -> bool:
                return any(sweep_done(node.url, token, sweep_id) for node in nodes)

            events = inject_faults(nodes, args.faults, args.lease, done, rng)
            wait_until(done, what="the sweep to finish", timeout=args.trials * 2.0)
            makespan = time.monotonic() - began
            rows = trial_rows(nodes[0].url, token, sweep_id, args.trials)
        finally:
            for node in nodes:
                node.stop()
        left_running = orphans(ledger)
        twice, redone = overlaps(ledger.read_text())
    cluster.drop_database(database)
    table = Table(title=f"faults: {args.trials} trials on {args.nodes} nodes ({makespan:.0f} s)")
    for column in ("submitted", "succeeded", "requeued", "lost", "run twice", "redone", "orphans"):
        table.add_column(column, justify="right")
    succeeded = sum(row["status"] == "succeeded" for row in rows)
    requeued = sum(int(str(row["attempt"])) > 1 for row in rows)
    table.add_row(
        str(args.trials),
        str(succeeded),
        str(requeued),
        str(len(rows) - succeeded),
        str(twice),
        str(redone),
        str(left_running),
    )
    console.print(f"faults injected: {', '.join(events) or 'none'}")
    console.print(table)
    unfinished = Counter(
        (str(row["status"]), str(row.get("error") or "")[:160])
        for row in rows
        if row["status"] != "succeeded"
    )
    for (status, error), count in unfinished.most_common(5):
        console.print(f"not succeeded: {count} {status}: {error}")


def claim_rate(nodes: list[Node], args: argparse.Namespace, ledger: Path) -> float:
    """Trials started per second while the sweep ran, from the starts the database recorded."""
    try:
        for node in nodes:
            node.start()
        sweep_id, token = submit(nodes[0], args.claim_trials, args.split, ledger, 0.0)
        wait_until(
            lambda: sweep_done(nodes[0].url, token, sweep_id),
            what="the sweep to finish",
            timeout=args.claim_trials * 2.0,
        )
        rows = trial_rows(nodes[0].url, token, sweep_id, args.claim_trials)
    finally:
        for node in nodes:
            node.stop()
    starts = sorted(datetime.fromisoformat(str(row["started_at"])) for row in rows)
    return (len(starts) - 1) / (starts[-1] - starts[0]).total_seconds()


def claim_runs(cluster: Cluster, args: argparse.Namespace) -> None:
    rates: dict[str, list[float]] = {"postgresql": [], "sqlite": []}
    for repeat in range(1, args.repeats + 1):
        for variant in ("postgresql", "sqlite"):
            with tempfile.TemporaryDirectory(prefix="gpumux-claims-") as scratch:
                root = Path(scratch)
                if variant == "postgresql":
                    database = cluster.create_database()
                    nodes = make_nodes(args.nodes, root, cluster.url(database), args.lease)
                else:
                    url = f"sqlite:///{root / 'gpumux.db'}"
                    nodes = make_nodes(1, root, url, args.lease)
                rate = claim_rate(nodes, args, root / "ledger")
                if variant == "postgresql":
                    cluster.drop_database(database)
            rates[variant].append(rate)
            console.print(f"repeat {repeat}: {variant}: {rate:.1f} trials started/s")
    table = Table(title=f"claims: {args.claim_trials} no-op trials, medians of {args.repeats}")
    for column in ("variant", "nodes", "trials started/s", "ratio"):
        table.add_column(column, justify="right")
    base = statistics.median(rates["sqlite"])
    for variant, count in (("sqlite", 1), ("postgresql", args.nodes)):
        rate = statistics.median(rates[variant])
        table.add_row(variant, str(count), f"{rate:.1f}", f"{rate / base:.2f}x")
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--claim-trials", type=int, default=300)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--split", type=int, default=8)
    parser.add_argument("--duration", type=float, default=0.5, help="seconds a trial sleeps")
    parser.add_argument("--lease", type=float, default=4.0, help="GPUMUX_NODE_LEASE, s")
    parser.add_argument("--faults", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    reason = unavailable()
    if reason is not None:
        raise SystemExit(f"benchmarks/nodes.py needs a PostgreSQL server: {reason}")
    console.print(f"$ python benchmarks/nodes.py {' '.join(sys.argv[1:])}".rstrip())
    console.print(
        f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{args.nodes} nodes, split {args.split}, lease {args.lease} s, seed {args.seed}"
    )
    cluster = start_cluster(Path(tempfile.mkdtemp(prefix="gpumux-pg-")))
    try:
        fault_run(cluster, args, random.Random(args.seed))
        if args.repeats:
            claim_runs(cluster, args)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
