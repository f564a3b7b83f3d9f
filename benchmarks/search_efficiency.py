"""How soon each search finds a good model: grid, random, tpe and tpe + asha on one budget.

    python benchmarks/search_efficiency.py [--repeats 3] [--epochs 30] [--target 0.04]
                                           [--budget 12] [--variants grid,random,tpe,...]
                                           [--quick] [--png FILE]

Every variant sweeps examples/digits_mlp.py (numpy, CPU device) over the same space, the
learning rate in 1e-4..1e-1 (log) and the width in 16, 64 or 128, with the same budget of
trials (12 by default; a multiple of 3), `--split auto` and `--objective val_loss:min`, through
a real `gpumux serve` on a fresh data directory per run (no stored profile: every run is a
first sweep and pays for its split search):
- grid: lr at budget/3 grid points (at 12: 1e-4, 1e-3, 1e-2, 1e-1) x 3 widths, in the
  grammar's order (lr by lr);
- random: budget seeded draws (lr log-uniform), all chosen at submission;
- tpe: budget trials asked of Optuna's TPE sampler as slots free;
- tpe + asha: the same, with ASHA pruning at each epoch's report (see ASHA below).
Measured per run, from the times the daemon recorded: makespan (submission to the sweep's end);
best objective (the lowest final val_loss of a trial that ran to its end, as Optuna's
best_value: a pruned trial's last value does not count); time to target (submission to the
first report, of any trial, of a val_loss at or under the target). The seed of random and tpe
changes with the repeat. Variants are interleaved, their order rotating with each repeat, and
medians are quoted. Progress goes to stderr, the results to stdout.

The goals (issue 24), each printed met or not where its variants ran: tpe + asha reaches the
target at least 2x sooner than grid in every repeat; tpe's median best val_loss is better than
random's (asked of a budget of 24).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

# Run as a script, its folder is on the path: the same daemon as the makespan benchmark's.
from sweep_makespan import daemon

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "examples/digits_mlp.py"
LR = "lr=1e-4..1e-1"
WIDTH = "width=16,64,128"
WIDTHS = len(WIDTH.split(","))
# Rungs at epochs 2, 6 and 18 of 30, keeping the best third at each: two epochs already tell
# a crawling or bouncing learning rate from a good one (the example's docstring), and 3 is
# the reduction factor of the ASHA paper's experiments.
ASHA = "asha:min_resource=2,reduction_factor=3"
# From a pilot of the 18 pairs lr in {1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1} x the 3 widths, 30
# epochs each: every lr in 3e-3..3e-2 gets under 0.04 at every width (within 3-15 epochs);
# 1e-4 (0.2-0.4), 1e-3 (0.05-0.07) and 1e-1 (0.07-1.2) never do.
TARGET = 0.04
FINAL = {"succeeded", "pruned"}

progress = Console(stderr=True, soft_wrap=True)
console = Console(soft_wrap=True, width=120)  # the table unwrapped, even in a pipe


@dataclass(frozen=True)
class Variant:
    """A search and the sweep fields that make it, beyond those every variant shares."""

    name: str
    fields: dict[str, Any]


@dataclass
class Run:
    """What one sweep of one variant gave."""

    variant: str
    makespan: float
    best: float
    to_target: float
    # (seconds since the submission, lowest val_loss reported so far), at each new low.
    curve: list[tuple[float, float]]
    statuses: Counter[str] = field(default_factory=Counter)
    epochs: int = 0
    splits: list[int] = field(default_factory=list)


def variants_for(budget: int, seed: int) -> list[Variant]:
    """The four searches, the seeded ones seeded with `seed`."""
    space = [LR, WIDTH]
    sampled = {"params": space, "trials": budget, "seed": seed}
    return [
        Variant("grid", {"params": [f"{LR}:{budget // WIDTHS}", WIDTH], "search": "grid"}),
        Variant("random", {**sampled, "search": "random"}),
        Variant("tpe", {**sampled, "search": "tpe"}),
        Variant("tpe + asha", {**sampled, "search": "tpe", "prune": ASHA}),
    ]


def run_sweep(home: Path, variant: Variant, epochs: int, target: float) -> Run:
    """One sweep of `variant` on a daemon of its own, and what it reached when."""
    with daemon(home) as client:
        created = client.post(
            "/sweeps",
            json={
                "command": [sys.executable, EXAMPLE, f"--epochs={epochs}"],
                "workdir": str(ROOT),
                "env": dict(os.environ),
                "split": "auto",
                "metric": "val_loss",
                "mode": "min",
                **variant.fields,
            },
        )
        if created.is_error:
            raise SystemExit(f"{variant.name}: the daemon refused the sweep: {created.text}")
        sweep_id = created.json()["id"]
        while (sweep := client.get(f"/sweeps/{sweep_id}").json())["status"] != "finished":
            time.sleep(0.5)
        rows = client.get(f"/sweeps/{sweep_id}/trials", params={"limit": 1000}).json()["data"]
        reports = [
            report
            for row in rows
            for report in client.get(f"/trials/{row['id']}/reports").json()["data"]
        ]
    unfinished = [row for row in rows if row["status"] not in FINAL]
    if unfinished:
        row = unfinished[0]
        raise SystemExit(
            f"{variant.name}: {len(unfinished)} trials ended {row['status']}: {row['error']}"
        )
    return measured(variant.name, sweep, rows, reports, target)


def measured(
    name: str,
    sweep: dict[str, Any],
    rows: list[dict[str, Any]],
    reports: list[dict[str, Any]],
    target: float,
) -> Run:
    """The run's figures from the daemon's records of its sweep, trials and reports."""
    start = datetime.fromisoformat(sweep["created_at"])
    points = sorted(
        ((datetime.fromisoformat(r["at"]) - start).total_seconds(), r["metrics"]["val_loss"])
        for r in reports
        if "val_loss" in r["metrics"]
    )
    curve: list[tuple[float, float]] = []
    for at, value in points:
        if not curve or value < curve[-1][1]:
            curve.append((at, value))
    finals = [
        r["objective"] for r in rows if r["status"] == "succeeded" and r["objective"] is not None
    ]
    return Run(
        variant=name,
        makespan=(datetime.fromisoformat(sweep["finished_at"]) - start).total_seconds(),
        best=min(finals, default=float("inf")),
        to_target=next((s for s, value in curve if value <= target), float("inf")),
        curve=curve,
        statuses=Counter(row["status"] for row in rows),
        epochs=sum(row["step"] + 1 for row in rows if row["step"] is not None),
        splits=sorted({row["split"] for row in rows if row["split"] is not None}),
    )


def seconds(value: float) -> str:
    return f"{value:.1f}" if value != float("inf") else "not reached"


def loss(value: float) -> str:
    return f"{value:.4f}" if value != float("inf") else "none"


def show(repeat: int, run: Run) -> None:
    reached = "not reached" if run.to_target == float("inf") else f"at {run.to_target:.1f} s"
    statuses = ", ".join(f"{count} {status}" for status, count in sorted(run.statuses.items()))
    progress.print(
        f"repeat {repeat + 1}: {run.variant:<10} makespan {run.makespan:6.1f} s, "
        f"best {loss(run.best)}, target {reached}, "
        f"{run.epochs} epochs trained ({statuses}; N: {run.splits})"
    )


def median(runs: list[Run], value: str) -> float:
    return float(statistics.median(getattr(run, value) for run in runs))


def sooner(grid: float, tpe_asha: float) -> float:
    """How many times sooner tpe + asha reached the target: 0 if it never did."""
    if tpe_asha == float("inf"):
        return 0.0
    return grid / tpe_asha


def report(runs: dict[str, list[Run]], target: float, repeats: int) -> None:
    """The table of medians per variant, the ratios of grid to tpe + asha, and the goal."""
    table = Table(title=f"medians of {repeats} repeats; target val_loss <= {target:g}")
    columns = (
        "variant",
        "makespan s",
        "best val_loss",
        "to target s",
        "epochs trained",
        "pruned",
        "to target s, each run",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for name, done in runs.items():
        table.add_row(
            name,
            seconds(median(done, "makespan")),
            loss(median(done, "best")),
            seconds(median(done, "to_target")),
            f"{statistics.median(run.epochs for run in done):.0f}",
            f"{statistics.median(run.statuses['pruned'] for run in done):.0f}",
            " ".join(seconds(run.to_target) for run in done),
        )
    console.print(table)
    if "grid" in runs and "tpe + asha" in runs:
        grid, tpe_asha = runs["grid"], runs["tpe + asha"]
        # Each repeat's grid against the same repeat's tpe + asha (the same load, nearly).
        ratios = [sooner(g.to_target, t.to_target) for g, t in zip(grid, tpe_asha, strict=True)]
        console.print(
            "grid / tpe + asha, time to target in each repeat: "
            + " ".join(f"{ratio:.2f}x" for ratio in ratios)
            + f"; makespan (medians) {median(grid, 'makespan') / median(tpe_asha, 'makespan'):.2f}x"
            + f"; best val_loss {loss(median(grid, 'best'))} vs {loss(median(tpe_asha, 'best'))}"
        )
        met = all(ratio >= 2 for ratio in ratios)
        console.print(
            "goal (tpe + asha reaches the target at least 2x sooner than grid in every repeat): "
            + ("met" if met else f"NOT met (lowest {min(ratios):.2f}x)")
        )
    if "tpe" in runs and "random" in runs:
        tpe, random = median(runs["tpe"], "best"), median(runs["random"], "best")
        console.print(
            "goal (tpe's median best val_loss better than random's, at a budget of 24): "
            + ("met" if tpe < random else "NOT met")
            + f" ({loss(tpe)} vs {loss(random)})"
        )


def plot(runs: dict[str, list[Run]], target: float, path: Path) -> None:
    """Lowest val_loss so far against time, every run of every variant, as a PNG."""
    # Imported here: matplotlib is a dev extra, needed only for --png.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    for color, (name, done) in zip(("C0", "C1", "C2", "C3"), runs.items(), strict=False):
        for number, run in enumerate(done):
            times = [t for t, _ in run.curve] + [run.makespan]
            values = [v for _, v in run.curve] + [run.curve[-1][1] if run.curve else target]
            label = name if number == 0 else None
            axes.step(times, values, where="post", color=color, alpha=0.8, label=label)
    axes.axhline(target, color="grey", linestyle="--", label=f"target {target:g}")
    axes.set(xlabel="seconds since submission", ylabel="lowest val_loss so far", yscale="log")
    axes.legend()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30, help="of every trial")
    parser.add_argument("--target", type=float, default=TARGET, help="val_loss to reach")
    parser.add_argument("--budget", type=int, default=12, help="trials per sweep (x3)")
    parser.add_argument(
        "--variants",
        default=",".join(v.name for v in variants_for(12, 0)),
        help="which searches, comma-separated",
    )
    parser.add_argument("--quick", action="store_true", help="1 repeat of 4 epochs: a smoke run")
    parser.add_argument("--png", type=Path, help="plot the lowest val_loss so far against time")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.epochs = 1, 4
    budget = args.budget
    if budget < WIDTHS or budget % WIDTHS:
        parser.error(f"--budget must be a multiple of {WIDTHS} (the grid's widths)")
    chosen = args.variants.split(",")
    unknown = set(chosen) - {v.name for v in variants_for(budget, 0)}
    if unknown:
        parser.error(f"--variants: no variant {sorted(unknown)[0]!r}")
    console.print(f"$ python benchmarks/search_efficiency.py {' '.join(sys.argv[1:])}".rstrip())
    console.print(
        f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"{budget} trials of {EXAMPLE} --epochs={args.epochs} per variant over {LR} {WIDTH} "
        f"(grid: {LR}:{budget // WIDTHS}), --split auto, prune {ASHA}; target val_loss <= "
        f"{args.target:g}; {args.repeats} repeats, variants interleaved"
    )
    runs: dict[str, list[Run]] = {}
    for repeat in range(args.repeats):
        variants = [v for v in variants_for(budget, seed=repeat + 1) if v.name in chosen]
        turn = repeat % len(variants)
        for variant in variants[turn:] + variants[:turn]:
            home = Path(tempfile.mkdtemp(prefix="gpumux-search-"))
            try:
                run = run_sweep(home, variant, args.epochs, args.target)
            finally:
                shutil.rmtree(home, ignore_errors=True)
            runs.setdefault(variant.name, []).append(run)
            show(repeat, run)
    runs = {v.name: runs[v.name] for v in variants_for(budget, seed=0) if v.name in chosen}
    report(runs, args.target, args.repeats)
    if args.png:
        plot(runs, args.target, args.png)
        console.print(f"plot: {args.png}")


if __name__ == "__main__":
    main()
