"""The CPU a fresh interpreter spends importing a module of gpumux, in several checkouts.

    python benchmarks/import_cpu.py /tmp/before . --module gpumux.server.daemon --runs 10

Each run is `python -c "import MODULE"` in a checkout (its own code first on the path), the
checkouts alternating, first one first in odd rounds; the CPU is the child's user + system
time (wait4). Prints each run, then per checkout the median and range, and whether the module
imported optuna and numpy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

LOADED = "import sys, {module}; print(*(m for m in ('optuna', 'numpy') if m in sys.modules))"


def cpu_of(tree: Path, code: str) -> float:
    """The CPU seconds of `python -c code` run in `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    process = subprocess.Popen([sys.executable, "-c", code], cwd=tree, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{tree}: python -c {code!r} exited {process.returncode}")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--module", default="gpumux.server.daemon")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    trees = [tree.resolve() for tree in args.trees]
    seconds: dict[Path, list[float]] = {tree: [] for tree in trees}
    for run in range(1, args.runs + 1):
        for tree in trees if run % 2 else trees[::-1]:
            spent = cpu_of(tree, f"import {args.module}")
            seconds[tree].append(spent)
            print(f"run {run:2} {tree}: {spent:.2f} s", flush=True)
    for tree in trees:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        loaded = subprocess.run(
            [sys.executable, "-c", LOADED.format(module=args.module)],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        runs = seconds[tree]
        print(
            f"{tree}: import {args.module}: median {statistics.median(runs):.2f} s of CPU "
            f"({min(runs):.2f}-{max(runs):.2f}, {len(runs)} runs); "
            f"loads {', '.join(loaded) or 'neither optuna nor numpy'}"
        )


if __name__ == "__main__":
    main()
