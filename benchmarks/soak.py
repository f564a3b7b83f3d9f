"""Soak: thousands of short trials while the daemon is killed and restarted at random moments.

    python benchmarks/soak.py [--trials 2000] [--sweeps 8] [--split 32] [--trial-seconds 6]
                              [--kills 20] [--sigkill-share 0.5] [--max-down 1.0] [--seed 0]
                              [--duration 900] [--keep]

A real `gpumux serve` (on a Unix socket, fresh data directory) runs `--sweeps` sweeps of no-op
trials, `--trials` in all, submitted one by one as the queue runs low. Each trial is a
`python -c` that appends "TRIAL ATTEMPT" to a file, so that every run of a command is counted,
then sleeps 0 to --trial-seconds (spread by trial id), so that some trials end while the
daemon is down and others outlive its restart. Whenever the number of finished trials passes
one of `--kills` random marks, the daemon is stopped by SIGKILL (a crash) or by SIGTERM (a graceful
stop: its trials run on), picked at random, left down for up to --max-down seconds, and
restarted on the same data directory. At the end it waits for every sweep to finish and prints
what it found. A trial lost or unfinished, a trial's command run more than once (no stop here
stops trials, so the supervisors should make every restart lose nothing), a trial recorded as
succeeded that never ran, or a process left behind (found through /proc: anything naming the
soak's directory on its command line or in its environment, and its descendants) is a defect
and makes the exit status 1. The daemon's peak memory is the largest VmHWM of its incarnations,
read just before each stop and at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
POLL_S = 0.2
FINAL_STATUSES = ("succeeded", "failed", "cancelled", "lost")
# One line per run of a trial's command, appended in one write (O_APPEND: lines never mix);
# then a sleep of 0 to --trial-seconds, spread by trial id: some trials outlive a restart.
RUN_RECORD = (
    "import os, sys, time; "
    "trial = os.environ['GPUMUX_TRIAL_ID']; "
    "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600); "
    "os.write(fd, f\"{trial} {os.environ['GPUMUX_ATTEMPT']}\\n\".encode()); "
    "time.sleep(float(sys.argv[2]) * (int(trial) * 7919 % 100) / 100)"
)
console = Console(soft_wrap=True)


@dataclass
class Daemon:
    """`gpumux serve` over one data directory on a Unix socket, restarted as often as asked."""

    home: Path
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    peak_kb: int = 0
    crashes: int = 0

    @property
    def socket_path(self) -> Path:
        return self.home / "gpumux.sock"

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def client(self) -> httpx.Client:
        transport = httpx.HTTPTransport(uds=str(self.socket_path))
        return httpx.Client(transport=transport, base_url="http://gpumux", timeout=30)

    def start(self) -> None:
        """Start it (again) and return once it answers /health."""
        env = {name: value for name, value in os.environ.items() if not name.startswith("GPUMUX_")}
        env.update(GPUMUX_HOME=str(self.home), GPUMUX_SPLIT_SEARCH="0", GPUMUX_KILL_GRACE="2")
        command = [sys.executable, "-m", "gpumux", "serve", "--uds", str(self.socket_path)]
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        with self.client() as client:
            while True:
                if not self.running:
                    raise SystemExit(f"the daemon exited at start:\n{self.log_tail()}")
                with contextlib.suppress(httpx.TransportError):
                    if client.get("/health").status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise SystemExit(f"the daemon did not answer in time:\n{self.log_tail()}")
                time.sleep(0.05)

    def sample_peak(self) -> None:
        """Note this incarnation's peak resident memory so far (VmHWM)."""
        assert self.popen is not None
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_kb = max(self.peak_kb, int(line.split()[1]))

    def stop(self, signum: int) -> None:
        """Stop it with this signal and collect it (SIGKILL after STOP_TIMEOUT_S)."""
        assert self.popen is not None
        self.sample_peak()
        self.popen.send_signal(signum)
        try:
            self.popen.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            console.print(f"the daemon ignored {signal.Signals(signum).name}; killing it")
            self.popen.kill()
            self.popen.wait()

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def log_count(self, marker: str) -> int:
        """How many lines of its log (all incarnations) carry `marker`."""
        with open(self.log_path, errors="replace") as log:
            return sum(marker in line for line in log)


@dataclass
class Poll:
    """What GET /sweeps says: trials per status over all sweeps, and the sweeps' ids by name."""

    statuses: Counter[str]
    sweep_ids: dict[str, int]

    @property
    def finished(self) -> int:
        return sum(self.statuses[status] for status in FINAL_STATUSES)


@dataclass
class Latency:
    """The slowest answer the API gave, and to what."""

    seconds: float = 0.0
    request: str = ""

    def timed(self, client: httpx.Client, method: str, url: str, **kwargs: Any) -> httpx.Response:
        began = time.monotonic()
        response = client.request(method, url, **kwargs)
        if (took := time.monotonic() - began) > self.seconds:
            self.seconds, self.request = took, f"{method} {url}"
        return response


def poll(daemon: Daemon, latency: Latency) -> Poll | None:
    """The state of all sweeps; None while the daemon does not answer."""
    try:
        with daemon.client() as client:
            page = latency.timed(client, "GET", "/sweeps", params={"limit": 500}).json()
    except httpx.TransportError:
        return None
    statuses: Counter[str] = Counter()
    for sweep in page["data"]:
        statuses.update(sweep["counts"])
    return Poll(statuses=statuses, sweep_ids={s["name"]: s["id"] for s in page["data"]})


def submit(
    daemon: Daemon,
    latency: Latency,
    *,
    name: str,
    size: int,
    split: int,
    folder: Path,
    runs: Path,
    seconds: float,
) -> int | None:
    """Submit a sweep of `size` no-op trials; its id, or None when the daemon did not answer
    (the sweep may exist all the same: look for its name before submitting it again)."""
    body = {
        "name": name,
        "params": [f"n=1..{size}" if size > 1 else "n=1", f"sweep={name.split()[-1]}"],
        "command": [sys.executable, "-c", RUN_RECORD, str(runs), str(seconds)],
        "workdir": str(folder),
        "env": {"PATH": os.environ["PATH"]},
        "split": split,
    }
    try:
        with daemon.client() as client:
            response = latency.timed(client, "POST", "/sweeps", json=body)
    except httpx.TransportError:
        return None
    if response.status_code != 201:
        raise SystemExit(f"submitting {name}: {response.status_code} {response.text}")
    return int(response.json()["id"])


def all_trials(daemon: Daemon, sweep_ids: list[int]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with daemon.client() as client:
        for sweep_id in sweep_ids:
            offset = 0
            while True:
                page = client.get(
                    f"/sweeps/{sweep_id}/trials", params={"offset": offset, "limit": 1000}
                ).json()
                rows.extend(page["data"])
                offset += len(page["data"])
                if not page["data"] or offset >= page["count"]:
                    break
    return rows


def leftovers(folder: Path) -> dict[int, str]:
    """Processes naming `folder` on their command line or in their environment, and their
    descendants (a trial's grandchild may carry neither): {pid: command line}."""
    mark = os.fsencode(folder)
    parents: dict[int, int] = {}
    marked: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            if stat[0] == "Z":
                continue  # it has exited; only its parent has yet to collect it
            parents[pid] = int(stat[1])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if mark in cmdline or mark in Path(f"/proc/{pid}/environ").read_bytes():
                marked[pid] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
    for pid in parents:
        ancestor = parents.get(pid)
        while ancestor is not None and ancestor > 1 and pid not in marked:
            if ancestor in marked:
                marked[pid] = f"(descendant of {ancestor})"
            ancestor = parents.get(ancestor)
    return marked


def wait_for_no_leftovers(folder: Path, timeout: float = 10.0) -> dict[int, str]:
    """What is still running after `timeout` (a supervisor takes a moment to exit)."""
    deadline = time.monotonic() + timeout
    while (left := leftovers(folder)) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return left


def split_evenly(total: int, parts: int) -> list[int]:
    parts = max(1, min(parts, total))
    return [total // parts + (1 if index < total % parts else 0) for index in range(parts)]


class Soak:
    """One soak run: the daemon, the sweeps fed to it, and the stops and restarts done to it."""

    def __init__(self, args: argparse.Namespace, folder: Path) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.folder = folder
        self.runs = folder / "runs.txt"
        self.daemon = Daemon(home=folder / "home", log_path=folder / "daemon.log")
        self.waiting = [
            (f"soak {number}", size)
            for number, size in enumerate(split_evenly(args.trials, args.sweeps), start=1)
        ]
        self.total = sum(size for _, size in self.waiting)
        self.sweep_ids: dict[str, int] = {}
        self.restarts: Counter[str] = Counter()
        self.latency = Latency()

    def next_mark(self, finished: int) -> float:
        """When to stop the daemon next: a random share of an even part of what is left, so
        that every stop has trials to interrupt."""
        left = self.args.kills - self.restarts.total()
        if not left:
            return float("inf")
        return finished + self.rng.uniform(0.2, 0.8) * (self.total - finished) / (left + 1)

    def drive(self, progress: Progress, began: float) -> None:
        """Feed sweeps and stop the daemon at the marks until every trial has finished."""
        task = progress.add_task("soak", total=self.total, sweeps=0, restarts=0)
        daemon = self.daemon
        # Set from the first answer after each restart, so that the trials that ended during
        # the restart do not shorten the next stretch.
        mark: float | None = None
        while time.monotonic() - began < self.args.duration:
            if not daemon.running:
                # Not one of ours: the daemon died by itself. Record it and carry on.
                daemon.crashes += 1
                console.print(f"the daemon exited by itself:\n{daemon.log_tail()}")
                daemon.start()
            state = poll(daemon, self.latency)
            if state is None:
                time.sleep(POLL_S)
                continue
            # A sweep whose submission got no answer may be there all the same.
            self.sweep_ids.update(state.sweep_ids)
            progress.update(task, completed=state.finished, sweeps=len(self.sweep_ids))
            if mark is None:
                mark = self.next_mark(state.finished)
            if state.finished >= self.total:
                return
            # Sweeps go in one by one as the queue runs low, as a user's would.
            if self.waiting and state.statuses["queued"] < 2 * self.args.split:
                if not self.submit_next():
                    continue
            if state.finished >= mark:
                self.restart()
                progress.update(task, restarts=self.restarts.total())
                mark = None
            time.sleep(POLL_S)

    def submit_next(self) -> bool:
        """Submit the next waiting sweep; False when the daemon did not answer."""
        name, size = self.waiting[0]
        if name not in self.sweep_ids:
            sweep_id = submit(
                self.daemon,
                self.latency,
                name=name,
                size=size,
                split=self.args.split,
                folder=self.folder,
                runs=self.runs,
                seconds=self.args.trial_seconds,
            )
            if sweep_id is None:
                return False
            self.sweep_ids[name] = sweep_id
        self.waiting.pop(0)
        return True

    def restart(self) -> None:
        """Stop the daemon at a random moment (launching, recording, or between ticks), by
        SIGKILL or SIGTERM, leave it down for a while, and start it again."""
        time.sleep(self.rng.uniform(0, 0.3))
        share = self.args.sigkill_share
        signum = signal.SIGKILL if self.rng.random() < share else signal.SIGTERM
        self.daemon.stop(signum)
        time.sleep(self.rng.uniform(0, self.args.max_down))
        self.daemon.start()
        self.restarts[signum.name] += 1

    def figures(
        self, rows: list[dict[str, Any]], left: dict[int, str], wall: float
    ) -> tuple[list[tuple[str, object, bool]], list[int], list[int]]:
        """(measure, value, a defect unless 0) rows; the trials run twice, and those lost."""
        statuses = Counter(row["status"] for row in rows)
        run_lines = self.runs.read_text().split("\n")[:-1] if self.runs.exists() else []
        runs_of = Counter(line.split()[0] for line in run_lines)
        succeeded_ids = {str(row["id"]) for row in rows if row["status"] == "succeeded"}
        # No stop here stops trials: a second run means gpumux lost track of a running one.
        rerun = sorted(int(trial) for trial, count in runs_of.items() if count > 1)
        lost = sorted(row["id"] for row in rows if row["status"] == "lost")
        finished = sum(statuses[status] for status in FINAL_STATUSES)
        log_count = self.daemon.log_count
        restarts = self.restarts
        return (
            [
                ("trials submitted", f"{len(rows)} of {self.total}", False),
                ("succeeded", statuses["succeeded"], False),
                ("failed", statuses["failed"], False),
                ("lost", len(lost), True),
                ("unfinished", self.total - finished, True),
                ("retried (attempt > 1)", sum(row["attempt"] > 1 for row in rows), False),
                ("command run more than once", len(rerun), True),
                ("one attempt run twice", sum(n > 1 for n in Counter(run_lines).values()), True),
                ("succeeded, never ran", len(succeeded_ids - runs_of.keys()), True),
                ("orphan processes", len(left), True),
                ("adopted at a restart", log_count(": adopted (supervisor pid"), False),
                ("ended while down", log_count("ended while the daemon was away"), False),
                (
                    "restarts",
                    f"{restarts['SIGKILL']} SIGKILL + {restarts['SIGTERM']} SIGTERM",
                    False,
                ),
                ("daemon exits unasked", self.daemon.crashes, True),
                ("daemon peak RSS", f"{self.daemon.peak_kb / 1024:.0f} MiB", False),
                (
                    "slowest API answer",
                    f"{self.latency.seconds:.2f} s ({self.latency.request})",
                    False,
                ),
                ("wall time", f"{wall:.0f} s ({self.total / wall:.1f} trials/s)", False),
            ],
            rerun,
            lost,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--sweeps", type=int, default=8)
    parser.add_argument("--split", type=int, default=32, help="trials at once (1-64)")
    parser.add_argument("--trial-seconds", type=float, default=6.0, help="longest trial, s")
    parser.add_argument("--kills", type=int, default=20, help="daemon stops and restarts")
    parser.add_argument("--sigkill-share", type=float, default=0.5, help="else SIGTERM")
    parser.add_argument("--max-down", type=float, default=1.0, help="longest downtime, s")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--duration", type=float, default=900.0, help="give up after, s")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    args = parser.parse_args()
    console.print(f"$ python benchmarks/soak.py {' '.join(sys.argv[1:])}".rstrip())
    console.print(
        f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"{args.trials} no-op trials of 0-{args.trial_seconds:g} s in {args.sweeps} sweeps at "
        f"split {args.split}, "
        f"{args.kills} stops ({args.sigkill_share:.0%} SIGKILL, else SIGTERM), seed {args.seed}"
    )
    folder = Path(tempfile.mkdtemp(prefix="gpumux-soak-"))
    soak = Soak(args, folder)
    daemon = soak.daemon
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(
            "trials finished, {task.fields[sweeps]} sweeps in, {task.fields[restarts]} restarts"
        ),
        TimeElapsedColumn(),
    )
    began = time.monotonic()
    daemon.start()
    try:
        with Progress(*columns, console=console, transient=True) as progress:
            soak.drive(progress, began)
    except BaseException:
        # Interrupted: leave no daemon behind (its trials are short and end by themselves).
        if daemon.running:
            daemon.stop(signal.SIGTERM)
        raise
    rows = all_trials(daemon, list(soak.sweep_ids.values()))
    daemon.sample_peak()
    daemon.stop(signal.SIGTERM)
    wall = time.monotonic() - began
    left = wait_for_no_leftovers(folder)

    figures, rerun, lost = soak.figures(rows, left, wall)
    table = Table(
        title=f"soak: {soak.total} trials, {soak.restarts.total()} restarts of the daemon",
        caption="* must be 0. Adopted and ended-while-down: lines of the daemon's log. "
        "Peak RSS: the largest VmHWM of the daemon's incarnations.",
    )
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name, value, must_be_zero in figures:
        table.add_row(f"{name} *" if must_be_zero else name, str(value))
    console.print(table)
    for pid, command in left.items():
        console.print(f"left running: pid {pid}: {command}")
    if rerun:
        console.print(f"trials whose command ran more than once: {rerun[:20]}")
    if lost:
        console.print(f"trials lost: {lost[:20]}")
    defects = sum(int(str(value)) for _, value, must_be_zero in figures if must_be_zero)
    if defects or args.keep:
        console.print(f"data directory and daemon log kept in {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if defects else 0


if __name__ == "__main__":
    sys.exit(main())
