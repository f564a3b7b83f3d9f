"""The split search on a simulated GPU: `--split auto` on a first sweep against every fixed N.

    python benchmarks/split_search.py --model FILE [--trials 48] [--trial-seconds 20]
                                      [--repeats 3] [--time-scale 1] [--splits N,N,...]

FILE is a model file or a shipped model's name (gpumux/devices/simulated/models:
h200-torch-mlp, h100-memory-bound, a100-compute-bound). Every variant runs the same sweep,
`--trials` simulated trials that last `--trial-seconds` each alone on the device (start-up
included; python -m gpumux.devices.simulated.trial --seconds S), through a real `gpumux serve`
serving the simulated GPU (GPUMUX_SIMULATED_GPU) on a fresh database:
- auto: `--split auto` with no profile stored, so the search is paid for in this sweep;
- N=k: `--split k` for each N the model names (or `--splits`).
Printed per variant: its makespan (submission to the sweep's end, as the daemon recorded them),
in simulated seconds; for auto also the N its trials ran at, the profile it left (settled or
not, at which N, when, its curve) and the model's aggregate rate at that N against the model's
best; then auto's makespan over the best fixed N's. Variants are interleaved, their order
rotating with each repeat, and medians are quoted.

--time-scale s runs the model's seconds s times as fast, and scales the split search's own
timers with it (GPUMUX_SPLIT_SETTLE, GPUMUX_SPLIT_WINDOW and GPUMUX_POLL_INTERVAL), so that the
search sees the same sweep in simulated time. What does not scale is this host's own cost per
trial (a Python process, the daemon's launch, its ticks): at 0.25 each real 0.1 s of it is
0.4 simulated seconds, so the smaller the scale, the more a variant with many short trials
pays. Figures to compare are taken at one scale.
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
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table
from sweep_makespan import daemon

from gpumux.config import Settings
from gpumux.devices.simulated.model import DeviceModel
from gpumux.devices.simulated.state import load_model

ROOT = Path(__file__).resolve().parents[1]
console = Console(soft_wrap=True)


def scaled_settings(model: str, scale: float) -> dict[str, str]:
    """The daemon's environment: the simulated GPU on the measured host's cores (the split
    search's first N and its plausibility checks count them), and the search's timers at its
    scale."""
    defaults = Settings()
    return {
        "GPUMUX_SIMULATED_GPU": model,
        "GPUMUX_HOST_CORES": str(load_model(model).cores),
        "GPUMUX_SIMULATED_TIME_SCALE": str(scale),
        "GPUMUX_SPLIT_SETTLE": str(defaults.split_settle * scale),
        "GPUMUX_SPLIT_WINDOW": str(defaults.split_window * scale),
        "GPUMUX_POLL_INTERVAL": str(defaults.poll_interval * scale),
    }


@dataclass(frozen=True)
class Run:
    """One sweep: its makespan in simulated seconds (None: trials failed), what it ran at."""

    makespan_s: float | None
    splits: Counter[int]
    failed: str | None
    profile: str = ""
    settled_at: int | None = None


def profile_line(client: httpx.Client, created: datetime, scale: float) -> tuple[str, int | None]:
    """The profile the auto sweep left, in one line, and the N it settled on (None: did not)."""
    profiles = client.get("/profiles").json()["data"]
    if not profiles:
        return "no profile stored", None
    profile = profiles[0]
    curve = ", ".join(f"{p['split']}: {p['throughput'] * scale:,.0f}" for p in profile["curve"])
    when = (datetime.fromisoformat(profile["updated_at"]) - created).total_seconds() / scale
    settled = profile["settled"] and profile["best_split"] is not None
    state = f"settled at N={profile['best_split']}" if settled else "not settled"
    line = f"{state} (last decision {when:.0f} s in); curve {{{curve}}} {profile['unit']}"
    return line, profile["best_split"] if settled else None


def run_sweep(
    home: Path, settings: dict[str, str], split: int | str, args: argparse.Namespace
) -> Run:
    """One sweep on a fresh database; its makespan in simulated seconds."""
    scale = args.time_scale
    command = [sys.executable, "-m", "gpumux.devices.simulated.trial"]
    with daemon(home, settings) as client:
        created = client.post(
            "/sweeps",
            json={
                "params": [],
                "trials": args.trials,
                "command": [*command, f"--seconds={args.trial_seconds}"],
                "workdir": str(ROOT),
                "env": dict(os.environ),
                "split": split,
            },
        )
        created.raise_for_status()
        sweep_id = created.json()["id"]
        while (sweep := client.get(f"/sweeps/{sweep_id}").json())["status"] != "finished":
            time.sleep(0.2)
        rows = client.get(f"/sweeps/{sweep_id}/trials", params={"limit": 1000}).json()["data"]
        started = datetime.fromisoformat(sweep["created_at"])
        profile, settled = profile_line(client, started, scale) if split == "auto" else ("", None)
    splits = Counter(row["split"] for row in rows)
    failed = [row for row in rows if row["status"] != "succeeded"]
    if failed:
        error = (failed[0]["error"] or "").splitlines()[0]
        return Run(None, splits, f"{len(failed)} failed: {error}", profile, settled)
    makespan = (datetime.fromisoformat(sweep["finished_at"]) - started).total_seconds() / scale
    return Run(makespan, splits, None, profile, settled)


def memory_fits(model: DeviceModel) -> int:
    """The most trials whose slices (at the daemon's default reserve and overhead) hold what
    one trial allocates."""
    defaults = Settings()
    room = model.memory_mb - defaults.reserve_mb
    return max(
        (n for n in range(1, room + 1) if room // n - defaults.overhead_mb >= model.slice_mb),
        default=0,
    )


def rate_share(model: DeviceModel, split: int | None) -> str:
    if split is None:
        return "-"
    best = max(rate for _, rate in model.throughput)
    return f"{model.aggregate(split) / best:.0%} of the model's best"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model file or a shipped model's name")
    parser.add_argument("--trials", type=int, default=48)
    parser.add_argument("--trial-seconds", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--splits", help="the fixed N to compare (default: the model's N)")
    args = parser.parse_args()
    model = load_model(args.model)
    if args.trial_seconds <= model.startup_s:
        parser.error(
            f"--trial-seconds must exceed the model's start-up ({model.startup_s:g} s): a trial "
            "alone is its start-up and then its work"
        )
    fixed = (
        [int(n) for n in args.splits.split(",")]
        if args.splits
        else [n for n, _ in model.throughput if n <= args.trials]
    )
    settings = scaled_settings(args.model, args.time_scale)
    console.print(f"$ python benchmarks/split_search.py {' '.join(sys.argv[1:])}".rstrip())
    console.print(
        f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"simulated {model.name} ({model.memory_mb:,} MiB, {model.cores} cores; its best rate "
        f"at N={model.best_split}, its memory fits N<={memory_fits(model)}); "
        f"{args.trials} trials of {args.trial_seconds:g} s "
        f"alone, time x{args.time_scale:g}, {args.repeats} repeats, variants interleaved"
    )
    variants: list[tuple[str, int | str]] = [("auto", "auto"), *((f"N={n}", n) for n in fixed)]
    runs: dict[str, list[Run]] = {name: [] for name, _ in variants}
    for repeat in range(args.repeats):
        order = variants[repeat % len(variants) :] + variants[: repeat % len(variants)]
        for name, split in order:
            home = Path(tempfile.mkdtemp(prefix="gpumux-split-search-"))
            try:
                run = run_sweep(home, settings, split, args)
            finally:
                shutil.rmtree(home, ignore_errors=True)
            runs[name].append(run)
            shown = f"{run.makespan_s:.0f} s" if run.makespan_s is not None else run.failed
            ran = ", ".join(f"{n}: {count}" for n, count in sorted(run.splits.items()))
            console.print(f"repeat {repeat + 1}: {name:<6} {shown}  (trials at N {{{ran}}})")
            if run.profile:
                console.print(f"    profile: {run.profile}", markup=False)
    report(model, runs, args)


def report(model: DeviceModel, runs: dict[str, list[Run]], args: argparse.Namespace) -> None:
    """The table of medians, and auto against the best fixed N."""
    median: dict[str, float] = {}
    table = Table(title=f"makespan of {args.trials} trials, simulated seconds (medians)")
    for column in ("variant", "makespan s", "runs s", "settled at"):
        table.add_column(column, justify="right")
    for name, done in runs.items():
        spans = [run.makespan_s for run in done if run.makespan_s is not None]
        if len(spans) == len(done) and spans:
            median[name] = statistics.median(spans)
        settled = ", ".join(
            "no" if run.settled_at is None else f"N={run.settled_at}" for run in done
        )
        table.add_row(
            name,
            f"{median[name]:.0f}" if name in median else "failed",
            " ".join("-" if s is None else f"{s:.0f}" for s in (r.makespan_s for r in done)),
            settled if name == "auto" else "",
        )
    console.print(table)
    fixed = {name: span for name, span in median.items() if name != "auto"}
    if fixed and "auto" in median:
        best = min(fixed, key=lambda name: fixed[name])
        console.print(
            f"auto / best fixed N ({best}): {median['auto'] / fixed[best]:.2f}x; auto settled at "
            + ", ".join(
                "no N"
                if run.settled_at is None
                else f"N={run.settled_at} ({rate_share(model, run.settled_at)})"
                for run in runs["auto"]
            )
        )


if __name__ == "__main__":
    main()
