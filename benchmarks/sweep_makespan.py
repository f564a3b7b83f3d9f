"""How soon one sweep finishes: sequentially, all at once, at each fixed N, and with --split auto.

    python benchmarks/sweep_makespan.py [--trials 12] [--splits 2,3,4] [--repeats 3] [--epochs 8]
                                        [--example digits|torch] [--warm]

Every variant runs the same sweep (`--trials` trials of an example, one seed each) through a
real `gpumux serve` on a fresh database, in one run of this script:
- sequential: --split 1;   N=k: --split k;   all at once: --split TRIALS;
- auto: --split auto on a database with no profile, so the search is paid for in this sweep;
- auto (reused): --split auto again on the same database: the stored profile is reused;
- with --warm, each fixed N and auto again with `--warm` (its daemon's warm spawner, started by
  the sweep's first trial, pays its preload inside the sweep), each compared with its cold twin.
Makespan is what the user waits for: from the submission to the sweep's end, as the daemon
recorded them. The variants are interleaved (their order rotates with each repeat) because
these machines are noisy, and medians are quoted.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from gpumux.home import tokenfile

ROOT = Path(__file__).resolve().parents[1]
console = Console(soft_wrap=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def daemon(home: Path, settings: dict[str, str] | None = None) -> Iterator[httpx.Client]:
    """`gpumux serve` on `home` with these GPUMUX_ settings (none of the caller's), and a client
    of it."""
    port = free_port()
    env = {name: value for name, value in os.environ.items() if not name.startswith("GPUMUX_")}
    env.update(settings or {})
    with open(home / "serve.log", "a") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpumux", "serve", "--port", str(port), "--home", str(home)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        client.get("/health").raise_for_status()
                        break
                    except httpx.TransportError as error:
                        if process.poll() is not None or time.monotonic() > deadline:
                            raise SystemExit(
                                f"serve did not start; see {home}/serve.log"
                            ) from error
                        time.sleep(0.1)
                client.headers["Authorization"] = f"Bearer {tokenfile.daemon_token(home)}"
                yield client
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=120)


EXAMPLES = {
    # Keras on scikit-learn's digits: TensorFlow, measured by gpumux with no script change.
    "digits": ["examples/digits_keras.py", "--width=64"],
    # PyTorch MLP (CUDA when there is a GPU): the variant for GPU machines without TensorFlow.
    "torch": ["examples/torch_mlp.py", "--width=1024", "--samples=100000"],
}


def run_sweep(
    home: Path, split: int | str, trials: int, epochs: int, example: str, warm: bool = False
) -> tuple[float, list[int]]:
    """Makespan of one sweep, and the N its trials ran at."""
    script, *flags = EXAMPLES[example]
    with daemon(home) as client:
        created = client.post(
            "/sweeps",
            json={
                "params": [f"seed=1..{trials}"],
                "command": [sys.executable, script, f"--epochs={epochs}", *flags],
                "workdir": str(ROOT),
                "env": dict(os.environ),
                "split": split,
                "metric": "val_accuracy",
                "mode": "max",
                "warm": warm,
            },
        )
        created.raise_for_status()
        sweep_id = created.json()["id"]
        while (sweep := client.get(f"/sweeps/{sweep_id}").json())["status"] != "finished":
            time.sleep(0.2)
        rows = client.get(f"/sweeps/{sweep_id}/trials", params={"limit": 1000}).json()["data"]
    failed = [row for row in rows if row["status"] != "succeeded"]
    if failed:
        raise SystemExit(f"split {split}: {len(failed)} trials failed: {failed[0]['error']}")
    makespan = datetime.fromisoformat(sweep["finished_at"]) - datetime.fromisoformat(
        sweep["created_at"]
    )
    return makespan.total_seconds(), [row["split"] for row in rows]


def profile_of(home: Path) -> str:
    with daemon(home) as client:
        profiles = client.get("/profiles").json()["data"]
    if not profiles:
        return "no profile stored"
    profile = profiles[0]
    curve = ", ".join(f"N={p['split']}: {p['throughput']:.0f}" for p in profile["curve"])
    return f"{curve} {profile['unit']}; {profile['reason']}"


def makespan_table(makespans: dict[str, list[float]], *, title: str) -> dict[str, float]:
    """Print each variant's median makespan, speed-up over sequential and runs; the medians."""
    median = {name: statistics.median(values) for name, values in makespans.items()}
    table = Table(title=title)
    for column in ("variant", "makespan s", "speed-up over sequential", "runs s"):
        table.add_column(column, justify="right")
    for name, values in makespans.items():
        table.add_row(
            name,
            f"{median[name]:.1f}",
            f"{median['sequential'] / median[name]:.2f}x",
            " ".join(f"{value:.1f}" for value in values),
        )
    console.print(table)
    return median


def show(repeat: int, name: str, seconds: float, used: list[int]) -> None:
    console.print(f"repeat {repeat + 1}: {name:<13} {seconds:6.1f} s  (N: {sorted(set(used))})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--splits", default="2,3,4", help="fixed N to compare besides 1 and all")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--example", choices=sorted(EXAMPLES), default="digits")
    parser.add_argument("--warm", action="store_true", help="also run each gpumux N and auto warm")
    args = parser.parse_args()
    fixed = [int(n) for n in args.splits.split(",")]
    console.print(f"$ python benchmarks/sweep_makespan.py {' '.join(sys.argv[1:])}".rstrip())
    console.print(
        f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"{args.trials} trials of {' '.join(EXAMPLES[args.example])} --epochs={args.epochs}, "
        f"{args.repeats} repeats, variants interleaved"
    )
    variants: list[tuple[str, int | str, bool]] = [
        ("sequential", 1, False),
        *((f"N={n}", n, False) for n in fixed),
        ("all at once", args.trials, False),
        ("auto", "auto", False),
    ]
    if args.warm:
        variants += [(f"N={n} warm", n, True) for n in fixed] + [("auto warm", "auto", True)]
    makespans: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    makespans["auto (reused)"] = []
    profiles: list[str] = []
    for repeat in range(args.repeats):
        order = variants[repeat % len(variants) :] + variants[: repeat % len(variants)]
        for name, split, warm in order:
            home = Path(tempfile.mkdtemp(prefix="gpumux-makespan-"))
            try:
                seconds, used = run_sweep(
                    home, split, args.trials, args.epochs, args.example, warm=warm
                )
                makespans[name].append(seconds)
                show(repeat, name, seconds, used)
                if name == "auto":
                    profiles.append(profile_of(home))
                    seconds, used = run_sweep(home, split, args.trials, args.epochs, args.example)
                    makespans["auto (reused)"].append(seconds)
                    show(repeat, "auto (reused)", seconds, used)
            finally:
                shutil.rmtree(home, ignore_errors=True)
    median = makespan_table(
        makespans, title=f"makespan of {args.trials} trials: medians of {args.repeats} repeats"
    )
    cold = [name for name, split, warm in variants if split != "auto" and not warm]
    best_name = min(cold, key=median.__getitem__)
    for name in ("auto", "auto (reused)"):
        console.print(
            f"{name}: {median[name] / median[best_name]:.2f} x the best fixed split "
            f"({best_name}, {median[best_name]:.1f} s); "
            f"{median['sequential'] / median[name]:.2f}x faster than sequential"
        )
    for name in (name for name, _, warm in variants if warm):
        twin = name.removesuffix(" warm")
        console.print(
            f"{name}: {median[name] / median[twin]:.2f} x {twin} started cold "
            f"({median[twin]:.1f} s against {median[name]:.1f} s)"
        )
    for number, profile in enumerate(profiles, 1):
        console.print(f"profile found by auto, repeat {number}: {profile}")


if __name__ == "__main__":
    main()
