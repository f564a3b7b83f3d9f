"""What gpumux adds to each trial: N no-op trials through a real daemon vs. a bare process pool.

    python benchmarks/launch_overhead.py [--trials 200] [--split 4] [--repeats 3]

Each repeat runs both variants, interleaved, on the same interpreter and script:
- bare:   a pool keeping `split` plain `python examples/noop.py` processes running;
- gpumux: one sweep of `trials` trials at --split `split` through `gpumux serve` (a real
          daemon process on a fresh database), submitted over HTTP.
Makespan is taken from the first start to the last end (gpumux: as recorded in its database).
Overhead per trial = (gpumux makespan - bare makespan) x split / trials: the time each slot
loses per trial to scheduling, bookkeeping and the in-trial bootstrap. Medians over repeats.
Each gpumux trial's recorded life (its start to its end, in the database) is then split into
phases by the times its run directory's records were written: the daemon's claim to the spec
written, the spawn to the supervisor recorded, the supervisor's start of the trial, the trial
itself (its leader recorded to its exit recorded), and the exit to its end recorded. A record's
time is when its file was written, before its fsyncs: the exit record's fsyncs fall in the last
phase.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from gpumux.home import tokenfile
from gpumux.home.layout import Layout
from gpumux.processes import rundir

ROOT = Path(__file__).resolve().parents[1]
NOOP = ROOT / "examples" / "noop.py"
console = Console(soft_wrap=True)


def bare_pool(trials: int, split: int) -> tuple[float, list[float]]:
    """Makespan and per-trial durations of `trials` plain processes, `split` at a time."""
    started = time.perf_counter()
    durations: list[float] = []
    running: dict[subprocess.Popen[bytes], float] = {}
    launched = 0
    while launched < trials or running:
        while launched < trials and len(running) < split:
            running[subprocess.Popen([sys.executable, str(NOOP)])] = time.perf_counter()
            launched += 1
        pid, _ = os.wait()
        for process, began in list(running.items()):
            if process.pid == pid:
                process.returncode = 0
                durations.append(time.perf_counter() - began)
                del running[process]
    return time.perf_counter() - started, durations


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


PHASES = {
    "claim to spec": (None, rundir.SPEC),
    "spawn": (rundir.SPEC, rundir.SUPERVISOR_RECORD),
    "supervisor starts the trial": (rundir.SUPERVISOR_RECORD, rundir.LEADER_RECORD),
    "trial": (rundir.LEADER_RECORD, rundir.EXIT_RECORD),
    "exit to end recorded": (rundir.EXIT_RECORD, None),
}


def phases_of(runs: Path, rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Seconds of each phase of each trial's recorded life (see the module's docstring), from
    when its run directory's records were written (None: the database's start or end)."""
    phases: dict[str, list[float]] = {name: [] for name in PHASES}
    for row in rows:
        run_dir = rundir.attempt_dir(runs, row["id"], row["attempt"])
        started, ended = epoch(row["started_at"]), epoch(row["ended_at"])
        for phase, (first, last) in PHASES.items():
            begin = started if first is None else mtime(run_dir / first)
            end = ended if last is None else mtime(run_dir / last)
            if begin is not None and end is not None:
                phases[phase].append(end - begin)
    return phases


def mtime(path: Path) -> float | None:
    return path.stat().st_mtime if path.exists() else None


def epoch(text: str) -> float:
    """Seconds since the epoch of an API time (UTC, written with or without its offset)."""
    moment = datetime.fromisoformat(text)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def gpumux_sweep(
    trials: int, split: int
) -> tuple[float, list[float], float, dict[str, list[float]]]:
    """Makespan and durations recorded by a real daemon, the submit-to-done wall time, and
    each trial's phases."""
    with tempfile.TemporaryDirectory(prefix="gpumux-bench-") as home:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        daemon_log = open(Path(home) / "daemon.log", "w")  # noqa: SIM115 - closed below
        daemon = subprocess.Popen(
            [sys.executable, "-m", "gpumux", "serve", "--port", str(port), "--home", home],
            stdout=daemon_log,
            stderr=subprocess.STDOUT,
        )
        try:
            with httpx.Client(base_url=url, timeout=30) as client:
                wait_for_health(client)
                token = tokenfile.daemon_token(Path(home))
                client.headers["Authorization"] = f"Bearer {token}"
                submitted = time.perf_counter()
                sweep = client.post(
                    "/sweeps",
                    json={
                        "params": [f"n=1..{trials}"],
                        "command": [sys.executable, str(NOOP)],
                        "workdir": str(ROOT),
                        "env": dict(os.environ),
                        "split": split,
                    },
                ).json()
                while client.get(f"/sweeps/{sweep['id']}").json()["status"] != "finished":
                    time.sleep(0.05)
                wall = time.perf_counter() - submitted
                rows = []
                for offset in range(0, trials, 1000):
                    page = client.get(
                        f"/sweeps/{sweep['id']}/trials", params={"offset": offset, "limit": 1000}
                    ).json()
                    rows.extend(page["data"])
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=60)
            daemon_log.close()
            if daemon.returncode != 0:
                console.print((Path(home) / "daemon.log").read_text()[-4000:])
        failed = [row for row in rows if row["status"] != "succeeded"]
        if failed:
            raise SystemExit(f"{len(failed)} no-op trials did not succeed: {failed[0]['error']}")
        phases = phases_of(Layout(Path(home)).runs, rows)
    starts = [datetime.fromisoformat(row["started_at"]) for row in rows]
    ends = [datetime.fromisoformat(row["ended_at"]) for row in rows]
    durations = [(end - start).total_seconds() for start, end in zip(starts, ends, strict=True)]
    return (max(ends) - min(starts)).total_seconds(), durations, wall, phases


def wait_for_health(client: httpx.Client) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            client.get("/health").raise_for_status()
            return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--split", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    console.print(f"$ python benchmarks/launch_overhead.py {' '.join(sys.argv[1:])}".rstrip())
    console.print(
        f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{args.trials} trials at split {args.split}, {args.repeats} repeats (interleaved)"
    )
    results: dict[str, list[float]] = {key: [] for key in ("bare", "gpumux", "wall", "over")}
    durations: dict[str, list[float]] = {"bare": [], "gpumux": []}
    phases: dict[str, list[float]] = {name: [] for name in PHASES}
    for repeat in range(1, args.repeats + 1):
        bare, bare_durations = bare_pool(args.trials, args.split)
        packed, packed_durations, wall, trial_phases = gpumux_sweep(args.trials, args.split)
        overhead = (packed - bare) * args.split / args.trials
        for key, value in (("bare", bare), ("gpumux", packed), ("wall", wall), ("over", overhead)):
            results[key].append(value)
        durations["bare"].extend(bare_durations)
        durations["gpumux"].extend(packed_durations)
        for name, seconds in trial_phases.items():
            phases[name].extend(seconds)
        console.print(
            f"repeat {repeat}: bare {bare:.2f} s, gpumux {packed:.2f} s "
            f"(submit to done {wall:.2f} s), overhead {overhead * 1000:.1f} ms/trial"
        )
    table = Table(
        title=f"{args.trials} no-op trials, split {args.split}: medians of {args.repeats}"
    )
    for column in ("variant", "makespan s", "trials/s", "median trial s"):
        table.add_column(column, justify="right")
    for key in ("bare", "gpumux"):
        makespan = statistics.median(results[key])
        table.add_row(
            key,
            f"{makespan:.2f}",
            f"{args.trials / makespan:.1f}",
            f"{statistics.median(durations[key]):.3f}",
        )
    console.print(table)
    console.print(
        "a gpumux trial's recorded life, median ms: "
        + ", ".join(
            f"{name} {statistics.median(seconds) * 1000:.1f}"
            for name, seconds in phases.items()
            if seconds
        )
    )
    console.print(
        f"overhead per trial over a bare start: {statistics.median(results['over']) * 1000:.1f} ms "
        f"(median; target <= 50 ms); submit to done: {statistics.median(results['wall']):.2f} s"
    )


if __name__ == "__main__":
    main()
