"""Hostile trials beside another user's: does one user's sweep hurt the shared daemon?

    python benchmarks/hostile.py [--backends sqlite,postgresql] [--flood-seconds 10]
                                 [--rate 100000] [--victims 4] [--victim-seconds 60]
                                 [--bomb 300] [--lease 30] [--json FILE]

As root, on loopback and Unix sockets only: two throwaway Linux users (useradd), one hostile,
one well-behaved, and a root `gpumux serve` per node that runs their trials as them. Once per
backend (SQLite, one node; PostgreSQL, two nodes sharing a throwaway cluster):
1. The other user's `--victims` trials start (one report a second for `--victim-seconds` s).
   Then the hostile user submits a report flood (`--rate` GPUMUX_REPORT lines a second for
   `--flood-seconds` s), an output flood (plain lines as fast as they go, as long), a trial
   whose grandchild escapes (fork, setsid, fork, sleep) and a fork bomb of `--bomb` processes
   (bounded here: a trial has no limit of its own that would stop one). Every node's /health
   is asked every `--interval` s throughout, each answer timed (one past `--request-timeout`
   counts as that long), until every trial above has ended or the phase's deadline.
2. The escape and the bomb are cancelled; then every node is restarted (SIGTERM, start); then
   killed (SIGKILL) and started. After each, the hostile trials' processes still alive are
   counted (each carries a marker in its environment).
Prints, per backend: /health p99 and worst; the other user's trials not succeeded, requeued,
slowed past the lease, and their reports stored; the database's growth; the flooding trial's
last value of each step as stored; the bomb's size; the processes left after each stop; how
long the daemon took to honour SIGTERM. The goals (issue 22) are in the last column.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from hostile_nodes import HealthPoller, Node, latency_figures, make_nodes
from hostile_table import print_table
from hostile_trials import Cast, census, kill_all, make_cast, remove_users, settle
from rich.console import Console

from gpumux.home import tokenfile

# The tests' throwaway cluster (initdb on a Unix socket, as postgres when root), reused here.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from postgres import Cluster, start_cluster, unavailable  # noqa: E402

console = Console(soft_wrap=True)
FINAL = ("succeeded", "failed", "cancelled", "lost", "pruned")
NODES = {"sqlite": 1, "postgresql": 2}
# The report flood, the output flood, the escape and the fork bomb.
HOSTILE_TRIALS = 4


@dataclass
class Run:
    """One backend's run: its nodes, its users' tokens, and how to size its database."""

    args: argparse.Namespace
    cast: Cast
    nodes: list[Node]
    db_bytes: Callable[[], int]
    tokens: dict[str, str]

    def call(self, method: str, path: str, *, who: str = "root", **kwargs: Any) -> Any:
        """The JSON answer of the first node that gives one; None when none did in time."""
        headers = {"Authorization": f"Bearer {self.tokens[who]}"}
        for node in self.nodes:
            try:
                answer = httpx.request(
                    method,
                    node.url + path,
                    headers=headers,
                    timeout=self.args.request_timeout,
                    **kwargs,
                )
            except httpx.TransportError:
                continue
            if answer.status_code >= 500:
                continue
            if not answer.is_success:
                raise RuntimeError(f"{method} {path}: {answer.status_code} {answer.text}")
            return answer.json()
        return None

    def submit(self, who: str, body: dict[str, Any]) -> int:
        """Submit a sweep as `who`; its id (an answer is waited for: a sweep is not resent)."""
        answer = self.call("POST", "/sweeps", who=who, json=body)
        if answer is None:
            raise RuntimeError(f"no node answered the submission of {body['name']}")
        return int(answer["id"])

    def trials(self, sweep_id: int) -> list[dict[str, Any]] | None:
        page = self.call("GET", f"/sweeps/{sweep_id}/trials", params={"limit": 1000})
        return None if page is None else list(page["data"])


def wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    """Poll `condition` until it holds (True) or `seconds` passed (False)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def all_in(run: Run, sweep_id: int, statuses: tuple[str, ...]) -> bool:
    rows = run.trials(sweep_id)
    return bool(rows) and all(row["status"] in statuses for row in rows or [])


def flood_phase(run: Run, figures: dict[str, Any]) -> dict[str, int]:
    """Phase 1: the other user's trials, then the hostile ones beside them; its sweeps."""
    args, cast = run.args, run.cast
    victims = run.submit("victim", cast.well_behaved(args.victims, args.victim_seconds))
    if not wait_for(lambda: all_in(run, victims, ("running",)), 60):
        raise RuntimeError("the other user's trials did not all start within 60 s")
    before = run.db_bytes()
    pollers = [HealthPoller(n.url, args.interval, args.request_timeout) for n in run.nodes]
    for poller in pollers:
        poller.start()
    began = time.monotonic()
    per_step = max(1, args.rate // 100)
    sweeps = {
        "victims": victims,
        "escape": run.submit("hostile", cast.escape()),
        "fork bomb": run.submit("hostile", cast.fork_bomb(args.bomb)),
        "output flood": run.submit("hostile", cast.output_flood(args.flood_seconds)),
        # Last: once it runs, the daemon may not answer for a while.
        "report flood": run.submit(
            "hostile", cast.report_flood(args.rate, args.flood_seconds, per_step)
        ),
    }
    deadline = began + args.victim_seconds + args.flood_seconds + args.drain_timeout
    watched = {
        "victims": victims,
        "flood": sweeps["report flood"],
        "output": sweeps["output flood"],
    }
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in watched}
    bomb = escaped = 0
    flood_seen: float | None = None
    try:
        while time.monotonic() < deadline:
            bomb = max(bomb, len(census(cast.mark(cast.hostile, "fork bomb"))))
            escaped = max(escaped, len(census(cast.mark(cast.hostile, "escape"))))
            for name, sweep_id in watched.items():
                rows[name] = run.trials(sweep_id) or rows[name]
            ended = {name: sum(row["status"] in FINAL for row in rows[name]) for name in rows}
            if ended["flood"] and flood_seen is None:
                flood_seen = time.monotonic() - began
            if ended == {"victims": args.victims, "flood": 1, "output": 1}:
                break
            time.sleep(0.5)
    finally:
        for poller in pollers:
            poller.stop()
    figures["phase_s"] = round(time.monotonic() - began, 1)
    figures["health"] = latency_figures(pollers)
    figures["db_growth_mb"] = round((run.db_bytes() - before) / 1e6, 2)
    figures["victims"] = victim_figures(run, rows["victims"])
    figures["report_flood"] = flood_figures(run, rows["flood"], per_step, flood_seen)
    output = cast.done_file("output flood")
    figures["output_flood"] = json.loads(output.read_text()) if output.exists() else None
    figures["fork_bomb"] = {"asked": args.bomb + 1, "peak": bomb}
    figures["escape_processes_seen"] = escaped
    return sweeps


def duration(row: dict[str, Any]) -> float | None:
    if not (row["started_at"] and row["ended_at"]):
        return None
    ended, started = (datetime.fromisoformat(row[at]) for at in ("ended_at", "started_at"))
    return (ended - started).total_seconds()


def victim_figures(run: Run, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The other user's trials: how many succeeded, ran late, were requeued; their reports."""
    args = run.args
    # Over the trials that ran to their end: one stopped early did not run long.
    overruns = [
        took - args.victim_seconds
        for row in rows
        if row["status"] == "succeeded" and (took := duration(row)) is not None
    ]
    # Unknown (None) when the daemon did not answer for one of them.
    stored: int | None = 0
    for row in rows:
        page = run.call("GET", f"/trials/{row['id']}/reports", params={"limit": 1})
        stored = None if page is None or stored is None else stored + int(page["count"])
    return {
        "trials": args.victims,
        "succeeded": sum(row["status"] == "succeeded" for row in rows),
        "unfinished": args.victims - sum(row["status"] in FINAL for row in rows),
        "requeued": sum(int(row["attempt"]) > 1 for row in rows),
        "slowed_past_lease": sum(overrun > args.lease for overrun in overruns),
        "worst_overrun_s": round(max(overruns), 1) if overruns else None,
        "reports_stored": stored,
        "reports_sent": args.victims * args.victim_seconds,
        "errors": sorted({str(row["error"])[:120] for row in rows if row["error"]}),
    }


def flood_figures(
    run: Run, rows: list[dict[str, Any]], per_step: int, seen: float | None
) -> dict[str, Any]:
    """The flooding trial: what it sent, what was stored, and whether each step's last value
    is the one it sent last."""
    done = run.cast.done_file("report flood")
    sent = json.loads(done.read_text()) if done.exists() else {}
    figures: dict[str, Any] = {
        "status": rows[0]["status"] if rows else None,
        "lines": sent.get("lines"),
        "send_s": round(sent["seconds"], 1) if sent else None,
        "end_seen_s": None if seen is None else round(seen, 1),
    }
    if not rows or rows[0]["status"] not in FINAL:
        return figures
    last: dict[int, float] = {}
    offset, count = 0, None
    deadline = time.monotonic() + run.args.drain_timeout
    while count is None or offset < count:
        if time.monotonic() > deadline:
            return figures | {"reports_stored": count, "reports_read": offset}
        params = {"offset": offset, "limit": 10_000}
        page = run.call("GET", f"/trials/{rows[0]['id']}/reports", params=params)
        if page is None:
            time.sleep(0.5)
            continue
        for report in page["data"]:
            if report["step"] is not None and "loss" in report["metrics"]:
                last[report["step"]] = report["metrics"]["loss"]
        offset, count = offset + len(page["data"]), int(page["count"])
        if not page["data"]:
            break
    lines = int(sent.get("lines", run.args.rate * run.args.flood_seconds))
    steps = math.ceil(lines / per_step)
    expected = [min((step + 1) * per_step, lines) - 1 for step in range(steps)]
    intact = sum(last.get(step) == value for step, value in enumerate(expected))
    return figures | {"reports_stored": count, "steps": steps, "steps_intact": intact}


def stop_phases(run: Run, sweeps: dict[str, int], figures: dict[str, Any]) -> None:
    """Phase 2: cancel, restart, kill -9 and restart; the hostile processes left after each."""
    args, cast = run.args, run.cast
    left: dict[str, int] = {}
    recorded: dict[str, bool] = {}
    figures.update(left=left, cancel_recorded=recorded, sigterm_s=[], answered_s=[])
    stopped = [sweeps["escape"], sweeps["fork bomb"]]

    def cancelled() -> bool:
        for sweep_id in stopped:
            run.call("POST", f"/sweeps/{sweep_id}/cancel")
        return all(all_in(run, sweep_id, FINAL) for sweep_id in stopped)

    def count(after: str) -> dict[int, str]:
        # The cancel again: a trial requeued by a lapsed lease may have run (and escaped)
        # again; only processes of trials recorded as ended count as left.
        recorded[after] = wait_for(cancelled, args.drain_timeout)
        found = settle(cast.mark(cast.hostile), args.settle)
        left[after] = len(found)
        return found

    count("cancel")
    for node in run.nodes:
        took = node.stop(args.stop_timeout)
        figures["sigterm_s"].append(None if took is None else round(took, 1))
        figures["answered_s"].append(restarted(node))
    count("restart")
    for node in run.nodes:
        node.kill()
        figures["answered_s"].append(restarted(node))
    figures["left_commands"] = sorted(set(count("kill -9").values()))[:5]
    # What became of the other user's trials once the daemons came back (a lapsed lease
    # requeues them; a daemon that never answered leaves them as they were).
    rows = run.trials(sweeps["victims"])
    if rows is not None:
        requeued = {"requeued": sum(int(row["attempt"]) > 1 for row in rows)}
        figures["victims_at_end"] = dict(Counter(row["status"] for row in rows)) | requeued


def restarted(node: Node) -> float | None:
    """Start a stopped node again: the seconds until it answered, None if it did not in time
    (the processes left are counted all the same)."""
    try:
        return round(node.start(), 1)
    except RuntimeError as error:
        console.print(f"{error}; counting on")
        return None


def sqlite_bytes(home: Path) -> Callable[[], int]:
    files = [home / "gpumux.db", home / "gpumux.db-wal"]
    return lambda: sum(path.stat().st_size for path in files if path.exists())


def postgres_bytes(cluster: Cluster, database: str) -> Callable[[], int]:
    def size() -> int:
        with cluster.connect(database) as connection:
            row = connection.execute("SELECT pg_database_size(current_database())").fetchone()
        assert row is not None
        return int(str(row[0]))

    return size


def run_backend(
    backend: str, cast: Cast, cluster: Cluster | None, args: argparse.Namespace
) -> dict[str, Any]:
    """Both phases on one backend; its figures (with `error` where it failed part way)."""
    root = cast.folder / backend
    root.mkdir(mode=0o700)
    env = {
        "CUDA_VISIBLE_DEVICES": "",
        "GPUMUX_TUNE": "0",
        "GPUMUX_KILL_GRACE": "2",
        "GPUMUX_NODE_LEASE": str(args.lease),
    }
    database = None
    if backend == "postgresql":
        assert cluster is not None
        database = cluster.create_database()
        env["GPUMUX_DATABASE_URL"] = cluster.url(database)
    nodes = make_nodes(NODES[backend], root, env)
    db_bytes = sqlite_bytes(nodes[0].home)
    if cluster is not None and database is not None:
        db_bytes = postgres_bytes(cluster, database)
    figures: dict[str, Any] = {"nodes": len(nodes)}
    try:
        for node in nodes:
            node.start()
        root_token = tokenfile.daemon_token(nodes[0].home)
        assert root_token is not None, f"no daemon token in {nodes[0].home}"
        tokens = {"root": root_token}
        for who, user in (("hostile", cast.hostile), ("victim", cast.victim)):
            tokens[who] = nodes[0].make_token(user.name)
        run = Run(args=args, cast=cast, nodes=nodes, db_bytes=db_bytes, tokens=tokens)
        sweeps = flood_phase(run, figures)
        stop_phases(run, sweeps, figures)
    except (RuntimeError, httpx.HTTPError) as error:
        figures["error"] = str(error)
        console.print(f"[red]{backend}: {error}[/red]")
        for node in nodes:
            console.print(f"{node.name}'s log, last lines:\n{node.log_tail(10)}")
    finally:
        for node in nodes:
            node.stop(args.stop_timeout)
        # What this backend's daemons and trials left: their supervisors, the escapees.
        for mark in (root, cast.mark(cast.hostile), cast.mark(cast.victim)):
            kill_all(list(census(mark)))
        if database is not None and cluster is not None:
            cluster.drop_database(database)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--flood-seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=100_000, help="report lines a second")
    parser.add_argument("--victims", type=int, default=4, help="the other user's trials")
    parser.add_argument("--victim-seconds", type=int, default=60)
    parser.add_argument("--bomb", type=int, default=300, help="processes the fork bomb forks")
    parser.add_argument("--lease", type=float, default=30.0, help="GPUMUX_NODE_LEASE, s")
    parser.add_argument("--interval", type=float, default=0.05, help="between /health asks, s")
    parser.add_argument("--request-timeout", type=float, default=10.0)
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=60.0,
        help="longest wait, past the trials' own time, for their ends, s",
    )
    parser.add_argument("--stop-timeout", type=float, default=30.0, help="SIGTERM to SIGKILL")
    parser.add_argument("--settle", type=float, default=5.0, help="wait for processes to go, s")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--keep", action="store_true", help="keep the run's folder")
    args = parser.parse_args()
    backends = [name.strip() for name in args.backends.split(",")]
    if unknown := [name for name in backends if name not in NODES]:
        parser.error(f"--backends: unknown {', '.join(unknown)} (sqlite, postgresql)")
    if "postgresql" in backends and (reason := unavailable()) is not None:
        parser.error(f"postgresql needs a PostgreSQL server: {reason}")
    # A SIGTERM unwinds like Ctrl-C, so that the cleanup below runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    console.print(f"$ python benchmarks/hostile.py {' '.join(sys.argv[1:])}".rstrip())
    console.print(
        f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"report flood {args.rate:,}/s for {args.flood_seconds:g} s, {args.victims} trials "
        f"of the other user of {args.victim_seconds} s, bomb {args.bomb}, lease {args.lease:g} s"
    )
    folder = Path(tempfile.mkdtemp(prefix="gpumux-hostile-"))
    users: list[str] = []
    cluster = None
    results: dict[str, dict[str, Any]] = {}
    try:
        # Four hostile trials and the other user's, all at once even on one node.
        cast = make_cast(folder, users, split=HOSTILE_TRIALS + args.victims)
        for backend in backends:
            if backend == "postgresql" and cluster is None:
                cluster = start_cluster(Path(tempfile.mkdtemp(prefix="gpumux-pg-")))
            results[backend] = run_backend(backend, cast, cluster, args)
    finally:
        kill_all(list(census(folder)))
        refused = remove_users(users)
        if cluster is not None:
            cluster.stop()
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    if refused:
        console.print(f"userdel refused {', '.join(refused)}: a process of theirs still runs?")
    print_table(results)
    if args.json is not None:
        args.json.write_text(json.dumps({"folder": str(folder), "backends": results}, indent=2))
    return 1 if any("error" in figures for figures in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
