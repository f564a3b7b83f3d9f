"""The split search on a simulated GPU: `--split auto` on a first sweep against every fixed N.

    python benchmarks/split_search.py (--model FILE | --random-models K [--seed S])
                                      [--trials 48] [--trial-seconds 20] [--repeats 3]
                                      [--time-scale 1] [--splits N,N,...]
                                      [--against DIR] [--keep-logs DIR]

FILE is a model file or a shipped model's name (gpumux/devices/simulated/models:
h200-torch-mlp, h100-memory-bound, a100-compute-bound). Every variant runs the same sweep,
`--trials` simulated trials that last `--trial-seconds` each alone on the device (start-up
included; python -m gpumux.devices.simulated.trial --seconds S), through a real `gpumux serve`
serving the simulated GPU (GPUMUX_SIMULATED_GPU) on a fresh database:
- auto: `--split auto` with no profile stored, so the search is paid for in this sweep;
- N=k: `--split k` for each N the model names (or `--splits`).
Printed per variant: its makespan (submission to the sweep's end, as the daemon recorded them),
in simulated seconds; for auto also the N its trials ran at, the profile it left (settled or
not, at which N, when, its curve) and the model's sweep rate at that N against the best that
memory allows (`sweep_rate`: trials of --trial-seconds, N at a time, start-up included: with
long start-ups it peaks past the steady aggregate's best N); then auto's makespan over the
best fixed N's, and whether the goal is met (within 10% of the best fixed N that ran every
trial, settled, at an N within 5% of the best sweep rate memory allows). Variants are
interleaved, their order rotating with each repeat, and medians are quoted.

--random-models K draws K plausible models (benchmarks/random_models.py, from --seed) and runs
each against the N its memory fits, the N of its best sweep rate and the given N just below the fit
(or --splits), then prints one line per model; each drawn file is kept and named, so that a
miss can be run again alone with --model.

--against DIR runs the same auto sweep on another checkout of gpumux as one more variant,
"auto@DIR" (its daemon imports gpumux from DIR: run the benchmark from outside both checkouts),
interleaved with the others, so that a change to the search is compared with the code before it
on the same fixed N and the same host load. --keep-logs DIR keeps each daemon's log there
(MODEL-VARIANT-REPEAT.log: the split search's decisions, points and rejections, one a line).

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
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx
from random_models import write_models
from rich.console import Console
from rich.table import Table
from sweep_makespan import daemon

from gpumux.config import Settings
from gpumux.devices.simulated.model import DeviceModel
from gpumux.devices.simulated.state import load_model
from gpumux.processes.procfs import kill_marked, start_ticks

ROOT = Path(__file__).resolve().parents[1]
# The environment entry that marks what a run started (its pid); not GPUMUX_*, which the
# daemon and the trials are not given.
RUN_MARK = "SPLIT_SEARCH_BENCHMARK_RUN"
# Each sweep's data directory; its supervisors' command lines (their spawner's) name it.
HOME_PREFIX = "gpumux-split-search-"
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
    line = (
        f"{state} (last decision {when:.0f} s in); curve {{{curve}}} {profile['unit']}; "
        f"{profile['reason']}"
    )
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


def memory_fits(model: DeviceModel, *, fixed: bool = False) -> int:
    """The most trials whose slices (at the daemon's default reserve) hold what one trial
    allocates, each with the overhead budgeted beside it: at `--split auto`, the model's CUDA
    context, which the daemon measures of the trials (they tell their pools) and budgets for
    their workload; at a fixed N (`fixed`), the configured overhead, as no search measures."""
    defaults = Settings()
    room = model.memory_mb - defaults.reserve_mb
    overhead = defaults.overhead_mb if fixed else model.context_mb
    return max(
        (n for n in range(1, room + 1) if room // n - overhead >= model.slice_mb),
        default=0,
    )


def sweep_rate(model: DeviceModel, split: int, trial_seconds: float) -> float:
    """The model's samples/s for a sweep of trials that last `trial_seconds` alone, N at a
    time: N trials start together (crowding each other's start-up on the host's cores), then
    each computes its work at aggregate(N) / N. Start-up weighs less the more trials share it,
    so with long start-ups this rate peaks past the model's steady one."""
    work = model.per_trial(1) * (trial_seconds - model.startup_s)
    life = model.startup_seconds(split) + work / model.per_trial(split)
    return split * work / life


def best_sweep_split(model: DeviceModel, trial_seconds: float, *, fixed: bool = False) -> int:
    """The N of the best sweep rate memory allows (the smallest on a tie), at `--split auto` or
    at a fixed N (`memory_fits`)."""
    fits = max(1, memory_fits(model, fixed=fixed))
    return max(range(1, fits + 1), key=lambda n: (sweep_rate(model, n, trial_seconds), -n))


def rate_share(model: DeviceModel, split: int | None, trial_seconds: float) -> float | None:
    """The model's sweep rate at `split` over the best at any N memory allows."""
    if split is None:
        return None
    best = best_sweep_split(model, trial_seconds)
    return sweep_rate(model, split, trial_seconds) / sweep_rate(model, best, trial_seconds)


def default_splits(model: DeviceModel, trials: int, drawn: bool, trial_seconds: float) -> list[int]:
    """The fixed N to compare: the N a shipped model names; for a drawn one, the N its memory
    fits, the N of its best sweep rate there and the given N just below the fit."""
    if not drawn:
        return [n for n, _ in model.throughput if n <= trials]
    fits = max(1, memory_fits(model, fixed=True))
    best = best_sweep_split(model, trial_seconds, fixed=True)
    below = max((n for n, _ in model.throughput if n < fits), default=fits)
    return sorted({min(n, trials) for n in (fits, best, below)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="a model file or a shipped model's name")
    which.add_argument("--random-models", type=int, metavar="K", help="K drawn models")
    parser.add_argument("--seed", type=int, default=1, help="draws the random models")
    parser.add_argument("--trials", type=int, default=48)
    parser.add_argument("--trial-seconds", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--splits", help="the fixed N to compare (default: the model's N)")
    parser.add_argument("--against", type=Path, help="another checkout whose auto runs too")
    parser.add_argument("--keep-logs", type=Path, help="a directory for each daemon's log")
    args = parser.parse_args()
    if args.against is not None:
        check_against(parser, args.against)
    if args.model is not None:
        names = [args.model]
    else:
        kept = Path(tempfile.mkdtemp(prefix="gpumux-random-models-"))
        names = [str(path) for path in write_models(args.random_models, args.seed, kept)]
    for name in names:
        if args.trial_seconds <= load_model(name).startup_s:
            parser.error(
                f"--trial-seconds must exceed {name}'s start-up ({load_model(name).startup_s:g}"
                " s): a trial alone is its start-up and then its work"
            )
    console.print(f"$ python benchmarks/split_search.py {' '.join(sys.argv[1:])}".rstrip())
    # Carried by its daemons and the trials (the sweeps' environment is this one), so that an
    # interrupted run ends them, and their supervisors (which outlive a stopped daemon on
    # purpose, ignoring SIGTERM), found by their command line.
    os.environ[RUN_MARK] = str(os.getpid())
    try:
        outcomes = [bench(name, args, drawn=args.model is None) for name in names]
    except BaseException:
        since = start_ticks(os.getpid()) or 0
        ended = kill_marked(f"{RUN_MARK}={os.getpid()}".encode(), since=since)
        ended += kill_supervisors(since)
        console.print(f"stopped; ended {len(ended)} processes its sweeps left running")
        raise
    if len(outcomes) > 1:
        met = sum(outcome.met for outcome in outcomes)
        console.print(f"goal met on {met} of {len(outcomes)} models:")
        for name, outcome in zip(names, outcomes, strict=True):
            console.print(f"  {'met   ' if outcome.met else 'MISSED'} {name}: {outcome.line}")


def kill_supervisors(since: int) -> list[int]:
    """SIGKILL the supervisors of this run's sweeps, started no earlier than `since` (start
    ticks); the pids killed. Forked by their daemon's spawner, whose environment is its own,
    they do not carry RUN_MARK; their command line, the spawner's, names the sweep's data
    directory. Their trials gone, they would retry for good to record an end in a directory the
    run removed."""
    killed = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                ours = f"/{HOME_PREFIX}".encode() in cmdline.read()
            if ours and (start_ticks(pid) or 0) >= since:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        except (OSError, ProcessLookupError):
            continue
    return killed


def check_against(parser: argparse.ArgumentParser, against: Path) -> None:
    """Refuse an --against that would not run its own code: its daemon imports gpumux from
    PYTHONPATH, which `python -m` puts after the working directory."""
    if not (against / "gpumux" / "__init__.py").is_file():
        parser.error(f"--against {against}: no gpumux package there (a checkout of gpumux)")
    here = Path.cwd() / "gpumux" / "__init__.py"
    if here.is_file() and here.resolve() != (against / "gpumux" / "__init__.py").resolve():
        parser.error(
            f"--against {against}: run from outside both checkouts (here, {Path.cwd()}, "
            "`python -m gpumux` would import this directory's gpumux, not DIR's)"
        )


@dataclass(frozen=True)
class Outcome:
    """Whether auto met the goal on one model, and why in one line."""

    met: bool
    line: str


def bench(name: str, args: argparse.Namespace, *, drawn: bool) -> Outcome:
    """Every variant on one model, interleaved; the table, and auto against the best fixed N."""
    model = load_model(name)
    fixed = (
        [int(n) for n in args.splits.split(",")]
        if args.splits
        else default_splits(model, args.trials, drawn, args.trial_seconds)
    )
    settings = scaled_settings(name, args.time_scale)
    if drawn:
        console.print(f"model {name}: {model.about}", markup=False)
    console.print(
        f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.1f}; "
        f"simulated {model.name} ({model.memory_mb:,} MiB, {model.cores} cores, start-up "
        f"{model.startup_s:g} s; its best steady rate at N={model.best_split}, its best "
        f"sweep rate at N={best_sweep_split(model, args.trial_seconds)}, its memory fits "
        f"N<={memory_fits(model)}, N<={memory_fits(model, fixed=True)} at a fixed N); "
        f"{args.trials} trials of {args.trial_seconds:g} s "
        f"alone, time x{args.time_scale:g}, {args.repeats} repeats, variants interleaved"
    )
    variants: list[tuple[str, int | str]] = [("auto", "auto"), *((f"N={n}", n) for n in fixed)]
    other = {**settings, "PYTHONPATH": str(args.against)} if args.against else settings
    if args.against:
        variants.insert(1, (f"auto@{args.against}", "auto"))
    runs: dict[str, list[Run]] = {name: [] for name, _ in variants}
    for repeat in range(args.repeats):
        order = variants[repeat % len(variants) :] + variants[: repeat % len(variants)]
        for variant, split in order:
            home = Path(tempfile.mkdtemp(prefix=HOME_PREFIX))
            try:
                chosen = other if variant.startswith("auto@") else settings
                run = run_sweep(home, chosen, split, args)
            finally:
                if args.keep_logs is not None and (home / "serve.log").exists():
                    args.keep_logs.mkdir(parents=True, exist_ok=True)
                    kept = f"{Path(name).stem}-{variant.replace('/', '_')}-{repeat + 1}.log"
                    shutil.copyfile(home / "serve.log", args.keep_logs / kept)
                shutil.rmtree(home, ignore_errors=True)
            runs[variant].append(run)
            shown = f"{run.makespan_s:.0f} s" if run.makespan_s is not None else run.failed
            ran = ", ".join(f"{n}: {count}" for n, count in sorted(run.splits.items()))
            console.print(
                f"repeat {repeat + 1}: {variant:<6} {shown}  (trials at N {{{ran}}}; "
                f"load {os.getloadavg()[0]:.1f})"
            )
            if run.profile:
                console.print(f"    profile: {run.profile}", markup=False)
    console.print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return report(model, runs, args)


def report(model: DeviceModel, runs: dict[str, list[Run]], args: argparse.Namespace) -> Outcome:
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
            settled if name.startswith("auto") else "",
        )
    console.print(table)
    fixed = {name: span for name, span in median.items() if not name.startswith("auto")}
    if not fixed or "auto" not in median:
        return Outcome(False, "auto or every fixed N failed")
    best = min(fixed, key=lambda name: fixed[name])
    outcomes = [
        goal(model, name, median[name] / fixed[best], best, runs[name], args.trial_seconds)
        for name in runs
        if name.startswith("auto") and name in median
    ]
    for outcome in outcomes:
        console.print(outcome.line)
    return outcomes[0]


def goal(
    model: DeviceModel,
    name: str,
    ratio: float,
    best: str,
    runs: list[Run],
    trial_seconds: float,
) -> Outcome:
    """Whether one auto variant met the goal: within 10% of the best fixed N's makespan,
    settled in every run, at an N within 5% of the best sweep rate memory allows."""
    shares = [rate_share(model, run.settled_at, trial_seconds) for run in runs]
    settled = ", ".join(
        "no N" if share is None else f"N={run.settled_at} ({share:.0%} of the feasible best)"
        for run, share in zip(runs, shares, strict=True)
    )
    line = f"{name} / best fixed N ({best}): {ratio:.2f}x; {name} settled at {settled}"
    met = ratio <= 1.10 and all(share is not None and share >= 0.95 for share in shares)
    return Outcome(met, line)


if __name__ == "__main__":
    main()
