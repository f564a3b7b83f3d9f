"""How soon one sweep finishes by hand, under Ray Tune, and under gpumux.

    python benchmarks/peers.py [--trials 12] [--epochs 5] [--splits 2,3,4] [--ray-cpus 2/3]
                               [--repeats 3] [--example digits|torch]

Every variant runs the same sweep (`--trials` trainings of a shipped example, one seed each, the
same flags) on this machine, each training in its own fresh process:
- sequential: the trainings one after another, as a plain loop would run them (no tool);
- Ray Tune cpu=F: a local Ray cluster of this machine's cores, one Tune trial per seed with
  `tune.with_resources(..., {"cpu": F})`, so cores / F trials run at once; each trial runs the
  example as a subprocess, as gpumux does, so both pay the same imports and start-up per
  training (a Tune function that imported the example once per worker would skip them);
- N=k: gpumux `--split k` on a fresh database (the machinery of sweep_makespan.py);
- auto: gpumux `--split auto` on a fresh database, so its split search is paid for in this sweep;
- auto (reused): `--split auto` again on the same database: the stored profile is reused.
Makespan is what the user waits for once the tool is up: for gpumux from the submission to the
sweep's end as the daemon recorded them (its start not counted), for Ray Tune `Tuner.fit()`
(`ray.init` not counted), for the loop its whole run. Variants are interleaved (their order
rotates with each repeat) because these machines are noisy, and medians are quoted.
Ray Tune comes from the `peers` extra (`pip install -e '.[tf,peers]'`); where it cannot be
imported its variants are skipped with the reason and the rest runs. Ray downloads nothing here:
no dashboard, no usage statistics, results under the run's temporary directory.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from rich.console import Console
from sweep_makespan import EXAMPLES, ROOT, makespan_table, profile_of, run_sweep

console = Console(soft_wrap=True)

# Set before Ray is imported, and inherited by its processes: nothing leaves this machine, Tune
# writes no CSV, JSON or TensorBoard logger files of its own, and its legacy output, unlike the
# new one, is silent at verbose=0 (the new one still prints a box per fit). Ray runs its workers,
# and so the trials they start, at nice 15 by default: on a machine shared with other work that
# starves them, while gpumux's trials run at nice 0, so Ray's run at 0 too.
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    "RAY_AIR_NEW_OUTPUT": "0",
    "RAY_worker_niceness": "0",
}
# Ray keeps resources in units of 1e-4: a fraction is rounded down to it, so that cores / F
# trials still fit (2/3 as 0.6667 would fit 2 trials on 2 cores, not 3).
RAY_RESOLUTION = 10_000
# Ray Tune's best CPU fraction per trial on this 2-core machine, of 1/2, 2/3 and 1: one pass of
# the twelve-trial sweep, on the machine busy with other work, took 265 s at 1/2, 128 s at 2/3
# and 166 s at 1 (--ray-cpus 1/2,2/3,1 measures them again).
RAY_CPUS = "2/3"
# Ray's object store holds nothing here but the trial function; its default is 30% of memory.
RAY_OBJECT_STORE_BYTES = 256 * 2**20
# How much of a failed training's stderr is quoted: its traceback, not TensorFlow's start-up.
OUTPUT_TAIL = 2000
FINAL_ACCURACY = re.compile(r"^final .*val_accuracy=([0-9.]+)", re.MULTILINE)


@dataclass(frozen=True)
class CpuFraction:
    """A Ray Tune CPU request per trial: its label as given, and the value Ray is asked for."""

    label: str
    value: float


@dataclass(frozen=True)
class Variant:
    """One way to run the sweep: a plain loop, Ray Tune at a CPU fraction, or gpumux at a split."""

    name: str
    tool: str
    setting: str | int | CpuFraction = ""


def parse_cpu_fractions(text: str, cores: int) -> list[CpuFraction]:
    """`1/2,2/3,1` as the CPU fractions Ray is asked for; ValueError says which one is wrong."""
    fractions = []
    for item in text.split(","):
        try:
            fraction = Fraction(item.strip())
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"--ray-cpus: {item!r} is not a number such as 0.5 or 2/3") from None
        if not 0 < fraction <= cores:
            raise ValueError(f"--ray-cpus: {item.strip()} is not in (0, {cores}], the cores here")
        value = int(fraction * RAY_RESOLUTION) / RAY_RESOLUTION
        fractions.append(CpuFraction(str(fraction), value))
    return fractions


def parse_splits(text: str) -> list[int]:
    """`2,3,4` as the fixed N gpumux runs at; ValueError says which one is wrong."""
    splits = []
    for item in text.split(","):
        if not item.strip().isdigit() or int(item) < 1:
            raise ValueError(f"--splits: {item!r} is not a whole number of trials, 1 or more")
        splits.append(int(item))
    return splits


def rotated(variants: Sequence[Variant], repeat: int) -> list[Variant]:
    """The variants in the order of this repeat: each repeat starts one later."""
    shift = repeat % len(variants) if variants else 0
    return [*variants[shift:], *variants[:shift]]


def final_accuracy(output: str) -> float:
    """The example's last `final ... val_accuracy=X` line, as a number."""
    found = FINAL_ACCURACY.findall(output)
    if not found:
        raise ValueError("the example printed no 'final ... val_accuracy=' line")
    return float(found[-1])


def faster(ratio: float) -> str:
    """A makespan ratio (ours / theirs) in words: `14% faster`, `3% slower`."""
    if ratio <= 1:
        return f"{1 - ratio:.0%} faster"
    return f"{ratio - 1:.0%} slower"


def verdicts(median: dict[str, float], fixed: Sequence[str], ray: Sequence[str]) -> list[str]:
    """gpumux auto's makespan against the best fixed N and the best Ray Tune setting, per line."""
    best_fixed = min(fixed, key=median.__getitem__)
    best_ray = min(ray, key=median.__getitem__) if ray else None
    lines = []
    for name in ("auto", "auto (reused)"):
        parts = [
            f"{name}: {median[name] / median[best_fixed]:.2f} x the best fixed N "
            f"({best_fixed}, {median[best_fixed]:.1f} s)"
        ]
        if best_ray is not None:
            ratio = median[name] / median[best_ray]
            parts.append(f"{ratio:.2f} x {best_ray} ({median[best_ray]:.1f} s), {faster(ratio)}")
        parts.append(f"speed-up over sequential {median['sequential'] / median[name]:.2f}x")
        lines.append("; ".join(parts))
    return lines


def ray_missing() -> str | None:
    """Why Ray Tune cannot run here (its ImportError), or None when it can."""
    try:
        import ray.tune  # noqa: F401
    except ImportError as error:
        return f"{error}; install it with pip install -e '.[peers]'"
    return None


def sweep_command(example: str, epochs: int) -> list[str]:
    """The command every variant runs per training, before its --seed."""
    script, *flags = EXAMPLES[example]
    return [sys.executable, script, f"--epochs={epochs}", *flags]


def quiet_env() -> dict[str, str]:
    """This environment without gpumux's variables, as sweep_makespan gives its daemon."""
    return {name: value for name, value in os.environ.items() if not name.startswith("GPUMUX_")}


def run_sequential(command: list[str], trials: int) -> float:
    """Seconds for the trainings one after another, each in its own process."""
    start = time.monotonic()
    for seed in range(1, trials + 1):
        done = subprocess.run(
            [*command, f"--seed={seed}"], cwd=ROOT, env=quiet_env(), capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SystemExit(
                f"sequential: seed {seed} exited {done.returncode}: {done.stderr[-OUTPUT_TAIL:]}"
            )
    return time.monotonic() - start


def ray_trial(config: dict[str, Any], command: list[str]) -> None:
    """One Ray Tune trial: the example in a process of its own, its accuracy reported."""
    from ray import tune

    done = subprocess.run(
        [*command, f"--seed={config['seed']}"], cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"seed {config['seed']} exited {done.returncode}: {done.stderr[-OUTPUT_TAIL:]}"
        )
    tune.report({"val_accuracy": final_accuracy(done.stdout)})


def run_ray(home: Path, cpus: CpuFraction, command: list[str], trials: int) -> float:
    """Seconds for Ray Tune's `fit()` of the sweep, each trial asking for `cpus` of a core."""
    import ray
    from ray import tune

    ray.init(
        address="local",
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
        object_store_memory=RAY_OBJECT_STORE_BYTES,
        _temp_dir=str(home / "ray"),
    )
    try:
        tuner = tune.Tuner(
            tune.with_resources(
                tune.with_parameters(ray_trial, command=command), {"cpu": cpus.value}
            ),
            param_space={"seed": tune.grid_search(list(range(1, trials + 1)))},
            run_config=tune.RunConfig(storage_path=str(home / "results"), verbose=0),
        )
        start = time.monotonic()
        results = tuner.fit()
        seconds = time.monotonic() - start
    finally:
        ray.shutdown()
    if results.errors:
        raise SystemExit(
            f"Ray Tune cpu={cpus.label}: {len(results.errors)} trials failed: {results.errors[0]}"
        )
    return seconds


def run_gpumux(name: str, home: Path, split: int | str, args: argparse.Namespace) -> float:
    """Makespan of one gpumux sweep on `home`, saying which N its trials ran at."""
    seconds, used = run_sweep(home, split, args.trials, args.epochs, args.example)
    console.print(f"  {name}: the trials ran at N {sorted(set(used))}")
    return seconds


def run_variant(variant: Variant, args: argparse.Namespace, home: Path) -> list[tuple[str, float]]:
    """Makespans of one variant on a fresh `home` (two for auto: its first and reused sweeps)."""
    command = sweep_command(args.example, args.epochs)
    if variant.tool == "sequential":
        return [(variant.name, run_sequential(command, args.trials))]
    if isinstance(variant.setting, CpuFraction):
        return [(variant.name, run_ray(home, variant.setting, command, args.trials))]
    makespans = [(variant.name, run_gpumux(variant.name, home, variant.setting, args))]
    if variant.setting == "auto":
        console.print(f"  profile found by auto: {profile_of(home)}")
        reused = f"{variant.name} (reused)"
        makespans.append((reused, run_gpumux(reused, home, "auto", args)))
    return makespans


def variants_of(args: argparse.Namespace, skipped: str | None) -> list[Variant]:
    """Every variant this run compares, Ray Tune's left out when it is `skipped`."""
    cores = os.cpu_count() or 1
    ray = [] if skipped else parse_cpu_fractions(args.ray_cpus, cores)
    return [
        Variant("sequential", "sequential"),
        *(Variant(f"Ray Tune cpu={cpus.label}", "ray", cpus) for cpus in ray),
        *(Variant(f"N={n}", "gpumux", n) for n in parse_splits(args.splits)),
        Variant("auto", "gpumux", "auto"),
    ]


def print_results(makespans: dict[str, list[float]], variants: list[Variant]) -> None:
    """The table of medians, then auto's ratios to the best fixed N and to Ray Tune."""
    repeats = max(len(values) for values in makespans.values())
    median = makespan_table(makespans, title=f"makespan of one sweep: medians of {repeats} repeats")
    fixed = [variant.name for variant in variants if isinstance(variant.setting, int)]
    ray = [variant.name for variant in variants if variant.tool == "ray"]
    for line in verdicts(median, fixed, ray):
        console.print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--splits", default="2,3,4", help="the fixed N gpumux runs at")
    parser.add_argument(
        "--ray-cpus", default=RAY_CPUS, help="Ray Tune's CPUs per trial, a variant each: 1/2,2/3,1"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--example", choices=sorted(EXAMPLES), default="digits")
    args = parser.parse_args()
    os.environ.update(RAY_ENV)
    skipped = ray_missing()
    try:
        variants = variants_of(args, skipped)
    except ValueError as error:
        parser.error(str(error))
    console.print(f"$ python benchmarks/peers.py {' '.join(sys.argv[1:])}".rstrip())
    console.print(
        f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"{args.trials} trials of {' '.join(EXAMPLES[args.example])} --epochs={args.epochs}, "
        f"{args.repeats} repeats, variants interleaved"
    )
    if skipped:
        console.print(f"Ray Tune skipped: {skipped}")
    else:
        import ray

        console.print(f"Ray Tune {ray.__version__}, a local cluster of {os.cpu_count()} CPUs")
    makespans: dict[str, list[float]] = {}
    for repeat in range(args.repeats):
        for variant in rotated(variants, repeat):
            console.print(f"repeat {repeat + 1}/{args.repeats}: {variant.name} ...")
            home = Path(tempfile.mkdtemp(prefix="peers-"))
            try:
                for name, seconds in run_variant(variant, args, home):
                    makespans.setdefault(name, []).append(seconds)
                    console.print(f"repeat {repeat + 1}/{args.repeats}: {name} {seconds:.1f} s")
            finally:
                shutil.rmtree(home, ignore_errors=True)
    print_results(makespans, variants)


if __name__ == "__main__":
    main()
