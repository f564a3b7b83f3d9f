"""The CPU of a daemon's whole start, in several checkouts: `gpumux serve` on a new data
directory, then again on the same one (its database at head), leaving as soon as it is idle.

    python benchmarks/serve_cpu.py /tmp/before . --runs 10

Each run starts `python -m gpumux serve` in a checkout (its own code first on the path) with
GPUMUX_LEAVE_WHEN_IDLE=0, the checkouts alternating, the first one first in odd rounds; the
CPU is the child's user + system time (wait4), imports, database, uvicorn's start and stop
included. A first round, not counted, writes each checkout's bytecode. Prints each run, then per
checkout and start the median and range.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

STARTS = ("new home", "same home again")


def serve_cpu(tree: Path, home: Path) -> float:
    """The CPU seconds of one `gpumux serve` on `home`, run in `tree`, until it leaves."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("GPUMUX_")}
    # Bytecode written, as an installed gpumux has it.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env |= {
        "PYTHONPATH": str(tree),
        "GPUMUX_LEAVE_WHEN_IDLE": "0",
        "GPUMUX_PORT": "0",
        "CUDA_VISIBLE_DEVICES": "",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "gpumux", "serve", "--home", str(home)],
        cwd=tree,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert process.stderr is not None
    log = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{tree}: gpumux serve failed:\n{log.decode(errors='replace')[-2000:]}")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    trees = [tree.resolve() for tree in args.trees]
    seconds: dict[tuple[Path, str], list[float]] = {
        (tree, start): [] for tree in trees for start in STARTS
    }
    with tempfile.TemporaryDirectory(prefix="serve-cpu-") as scratch:
        for run in range(args.runs + 1):
            for tree in trees if run % 2 else trees[::-1]:
                home = Path(scratch) / f"{run}-{trees.index(tree)}" / "home"
                spent = [serve_cpu(tree, home) for _ in STARTS]
                if run == 0:
                    continue
                for start, cpu in zip(STARTS, spent, strict=True):
                    seconds[tree, start].append(cpu)
                shown = ", ".join(f"{s} {c:.2f} s" for s, c in zip(STARTS, spent, strict=True))
                print(f"run {run:2} {tree}: {shown}", flush=True)
    for (tree, start), runs in seconds.items():
        print(
            f"{tree}: serve, {start}: median {statistics.median(runs):.2f} s of CPU "
            f"({min(runs):.2f}-{max(runs):.2f}, {len(runs)} runs)"
        )


if __name__ == "__main__":
    main()
