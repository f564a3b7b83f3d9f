"""What refusing a hostile request costs the daemon: its CPU time and the wall time per request.

Starts its own `gpumux serve` on a free port with a fresh database in a temporary directory,
then sends, interleaved, round after round: (a) a body far over the size limit, (b) the largest
request the limits allow, crafted to be as expensive to validate as they let it be (a grid over
the limit: every parameter with the most grid points, the longest command and environment),
(b2) the most parameters, each a choice of as many values as fit, (c) a 100-digit integer in a
path and in a body, and (d) a cheap valid GET as a baseline. The daemon's CPU time is read from
/proc/PID/stat (utime + stime, in clock ticks) before and after each sample; cheap variants are
sent several times per sample so that a tick is small beside what is measured. Prints the
medians per variant and the goal. Writes nothing but stdout.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sweep_makespan import free_port

from gpumux import __version__, fields
from gpumux.config import Settings
from gpumux.grammar import sweepspec
from gpumux.home.tokenfile import daemon_token

GOAL_CPU_MS = 100.0
STARTUP_DEADLINE_S = 60.0
# Before the limits a refusal took a minute of CPU: one that regresses is measured, not dropped.
REQUEST_TIMEOUT_S = 600.0
TICK_S = 1 / os.sysconf("SC_CLK_TCK")
BIG_INT = "1" * 100


@dataclass(frozen=True)
class Variant:
    """One kind of request: what it is, the status that refusing it should give, how to send it."""

    key: str
    what: str
    expected: str
    send: Callable[[httpx.Client], httpx.Response]
    repeat: int = 1


@dataclass
class Samples:
    """Per variant: CPU seconds per request, wall seconds per request, the answers seen."""

    cpu: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    statuses: set[str] = field(default_factory=set)


def daemon_cpu_s(pid: int) -> float:
    """The CPU time (user + system) a process has spent, all its threads together."""
    # The fields after the command name, which may hold spaces and ')'.
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def expensive_sweep(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    """The largest sweep the limits let through to validation, its grid over the limit.

    Every parameter has the most grid points; what the body limit leaves after them goes to
    the command and the environment, each up to its own limit.
    """
    params = [f"p{index}=1e-9..1.0:log:{args.points}" for index in range(args.params)]
    # Words and variables as long as one may be, as many as the totals allow.
    word = "x" * (fields.MAX_ARG_BYTES - 1)
    command = ["true", *[word] * (args.command_bytes // fields.MAX_ARG_BYTES - 1)]
    value = "x" * (fields.MAX_ARG_BYTES - len("PAD00=") - 1)
    env = {f"PAD{index:02}": value for index in range(args.env_bytes // fields.MAX_ARG_BYTES)}
    sweep = {"params": params, "command": command, "workdir": workdir, "env": env}
    if body_size(sweep) > args.body_bytes:
        raise SystemExit(
            f"the sweep takes {body_size(sweep):,} bytes, over --body-bytes {args.body_bytes:,}: "
            "lower --params, --command-bytes or --env-bytes"
        )
    return sweep


def choices_sweep(workdir: str) -> dict[str, Any]:
    """The most parameters allowed, each a choice of as many values as the total length lets
    it hold: a grid far over any limit, to be counted, not expanded."""
    per_token = sweepspec.MAX_PARAMS_CHARS // sweepspec.MAX_PARAMS
    values = ",".join(str(value) for value in range(sweepspec.MAX_CHOICES))
    values = values[: per_token - len("p000=")].rpartition(",")[0]
    params = [f"p{index:03}={values}" for index in range(sweepspec.MAX_PARAMS)]
    return {"params": params, "command": ["true"], "workdir": workdir}


def body_size(body: dict[str, Any]) -> int:
    """The bytes of `body` as the client sends it."""
    return len(httpx.Request("POST", "http://localhost/", json=body).content)


def variants(args: argparse.Namespace, workdir: str) -> list[Variant]:
    """The requests measured, in the order each round sends them."""
    huge = b'{"name": "' + b"x" * (args.huge_mb * 1024 * 1024) + b'"}'
    expensive = expensive_sweep(args, workdir)
    size = body_size(expensive)
    choices = choices_sweep(workdir)
    report = f'{{"trial_id": {BIG_INT}, "attempt": 1, "kind": "manual"}}'.encode()
    json_headers = {"Content-Type": "application/json"}
    return [
        Variant(
            "a",
            f"POST /sweeps, a {args.huge_mb} MB body",
            "413",
            lambda http: http.post("/sweeps", content=huge, headers=json_headers),
        ),
        Variant(
            "b",
            f"POST /sweeps, {args.params} params x {args.points:,} points, {size:,} bytes",
            "422",
            lambda http: http.post("/sweeps", json=expensive),
        ),
        Variant(
            "b2",
            f"POST /sweeps, {sweepspec.MAX_PARAMS} choices, {body_size(choices):,} bytes",
            "422",
            lambda http: http.post("/sweeps", json=choices),
        ),
        Variant(
            "c1",
            "GET /sweeps/<100 digits>",
            "404 or 422",
            lambda http: http.get(f"/sweeps/{BIG_INT}"),
            args.repeat_cheap,
        ),
        Variant(
            "c2",
            "POST /reports, trial_id of 100 digits",
            "422",
            lambda http: http.post("/reports", content=report, headers=json_headers),
            args.repeat_cheap,
        ),
        Variant("d", "GET /health (baseline)", "200", lambda http: http.get("/health"), 20),
    ]


def measure(
    connect: Callable[[], httpx.Client], pid: int, variant: Variant, samples: Samples
) -> None:
    """One sample: the variant sent `repeat` times on a connection of its own (a connection
    the daemon drops is charged to the variant that made it drop it), its cost divided."""
    with connect() as http:
        cpu_before, wall_before = daemon_cpu_s(pid), time.perf_counter()
        for _ in range(variant.repeat):
            try:
                samples.statuses.add(str(variant.send(http).status_code))
            except httpx.TransportError as error:
                samples.statuses.add(type(error).__name__)
    samples.wall.append((time.perf_counter() - wall_before) / variant.repeat)
    samples.cpu.append((daemon_cpu_s(pid) - cpu_before) / variant.repeat)


def report(measured: list[tuple[Variant, Samples]]) -> None:
    print("| | request | expected | got | CPU ms (median) | wall ms (median) | goal met |")
    print("|---|---|---|---|---:|---:|---|")
    for variant, samples in measured:
        cpu_ms = statistics.median(samples.cpu) * 1000
        wall_ms = statistics.median(samples.wall) * 1000
        got = ", ".join(sorted(samples.statuses))
        met = "yes" if cpu_ms < GOAL_CPU_MS else "**no**"
        met = met if variant.expected != "200" else "(not a refusal)"
        print(
            f"| {variant.key} | {variant.what} | {variant.expected} | {got} "
            f"| {cpu_ms:,.1f} | {wall_ms:,.1f} | {met} |"
        )
    print(
        f"\ngoal: under {GOAL_CPU_MS:g} ms of the daemon's CPU per refusal. CPU is read in clock "
        f"ticks of {TICK_S * 1000:g} ms; a variant sent N times per sample has its cost / N."
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5, help="samples of each variant")
    parser.add_argument("--huge-mb", type=int, default=50, help="(a): the body's size in MB")
    parser.add_argument(
        "--params", type=int, default=sweepspec.MAX_PARAMS, help="(b): how many parameters"
    )
    parser.add_argument(
        "--points",
        type=int,
        default=sweepspec.MAX_POINTS,
        help="(b): the most grid points a parameter may have (default sweepspec.MAX_POINTS)",
    )
    parser.add_argument(
        "--command-bytes",
        type=int,
        default=fields.MAX_COMMAND_BYTES,
        help="(b): the command's bytes (default fields.MAX_COMMAND_BYTES)",
    )
    parser.add_argument(
        "--env-bytes",
        type=int,
        default=fields.MAX_ENV_BYTES,
        help="(b): the environment's bytes (default fields.MAX_ENV_BYTES)",
    )
    parser.add_argument(
        "--body-bytes",
        type=int,
        default=Settings().max_body_bytes,
        help="the body size limit, which (b) stays under (default Settings().max_body_bytes)",
    )
    parser.add_argument("--repeat-cheap", type=int, default=20, help="(c): requests per sample")
    args = parser.parse_args()
    if min(args.rounds, args.huge_mb, args.params, args.points, args.repeat_cheap) < 1:
        parser.error("--rounds, --huge-mb, --params, --points and --repeat-cheap must be >= 1")
    return args


@contextmanager
def own_daemon(home: Path) -> Iterator[tuple[Callable[[], httpx.Client], int]]:
    """`gpumux serve` on a free port over `home`: how to connect (with its token), its pid."""
    url = f"http://127.0.0.1:{free_port()}"
    env = {name: value for name, value in os.environ.items() if not name.startswith("GPUMUX_")}
    # The scheduler ticks in the daemon's process: rarely, so that its CPU stays out of the way.
    env |= {"GPUMUX_HOME": str(home), "GPUMUX_POLL_INTERVAL": "60", "GPUMUX_SPLIT_SEARCH": "0"}
    command = [sys.executable, "-m", "gpumux", "serve", "--port", url.rpartition(":")[2]]
    with open(home / "serve.log", "w") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_S) as http:
            deadline = time.monotonic() + STARTUP_DEADLINE_S
            while not _answers(http):
                if process.poll() is not None or time.monotonic() > deadline:
                    log_tail = (home / "serve.log").read_text()[-2000:]
                    raise SystemExit(f"gpumux serve did not start:\n{log_tail}")
                time.sleep(0.05)
        headers = {"Authorization": f"Bearer {daemon_token(home)}"}
        yield (
            lambda: httpx.Client(base_url=url, headers=headers, timeout=REQUEST_TIMEOUT_S),
            process.pid,
        )
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=STARTUP_DEADLINE_S)


def _answers(http: httpx.Client) -> bool:
    try:
        return http.get("/health").is_success
    except httpx.TransportError:
        return False


def main() -> None:
    args = parse_args()
    print(f"$ {shlex.join(sys.orig_argv)}")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, gpumux {__version__}; client and daemon share them"
    )
    with tempfile.TemporaryDirectory(prefix="gpumux-refusal-") as scratch:
        home = Path(scratch) / "home"
        home.mkdir()
        with own_daemon(home) as (connect, pid):
            measured = [(variant, Samples()) for variant in variants(args, scratch)]
            for round_number in range(1, args.rounds + 1):
                for variant, samples in measured:
                    measure(connect, pid, variant, samples)
                print(f"round {round_number}/{args.rounds} done", file=sys.stderr, flush=True)
    print()
    report(measured)


if __name__ == "__main__":
    main()
