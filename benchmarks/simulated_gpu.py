"""The simulated H200 against the real one: `gpumux tune` replayed, samples/s per N side by side.

    python benchmarks/simulated_gpu.py [--model h200-torch-mlp] [--time-scale 1]
                                       [--splits 1,2,3,5,8,13,21,34] [--epochs 3,10]
    python benchmarks/simulated_gpu.py --crowd 34 [--model h200-torch-mlp]

For each --epochs E it runs the real `gpumux tune --splits ... -- python -m
gpumux.devices.simulated.trial --epochs E` with GPUMUX_SIMULATED_GPU set (its own daemon, its
own temporary database, as tune always does), reads each round's line ("N=13: 13/13
succeeded, round 21.7s, 4,992,000 samples reported") and prints, per E and N, the samples/s
measured on the NVIDIA H200 on 2026-11-26 (../shared/measured/h200-2026-11-26.md: gpumux tune of
examples/torch_mlp.py at --epochs 10 and 3), the simulated samples/s (samples over the round in
simulated seconds: the real round divided by the time scale) and their ratio. Measured figures
exist only for the H200 model and the N measured; other models print the simulated column.

--crowd K instead starts K simulated trials at once on a device of the model with no daemon
(their state directory written here), each computing for 30 simulated seconds after its
start-up, and prints what they cost this host: the CPU seconds each took to start (interpreter,
imports, until its first look at the device), the CPU they use while they all sleep through
their steps, and how far their rate strayed from the model's aggregate(K) / K.

A time scale below 1 shortens the model's seconds but not this host's own (starting a Python
process, the daemon's launches and polls), which then weigh more: calibrate at 1.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gpumux.devices.simulated.state import Device, census, load_model, write_device

ROOT = Path(__file__).resolve().parents[1]
console = Console(soft_wrap=True)
ROUND = re.compile(
    r"^N=(\d+): (\d+)/(\d+) succeeded, round (\S+), ([\d,.]+) samples reported", re.MULTILINE
)
# `gpumux tune` of examples/torch_mlp.py on the H200: aggregate samples/s (samples / round),
# by --epochs, then N.
MEASURED_H200 = {
    10: {1: 52_033, 2: 106_224, 3: 154_839, 5: 230_216, 8: 307_508, 13: 339_592},
    3: {1: 25_770, 13: 230_572, 21: 260_030, 34: 254_480},
}
H200_MODEL = "NVIDIA H200"


def seconds(text: str) -> float:
    """A round as tune prints it: 9.87s, 21.7s or H:MM:SS."""
    if text.endswith("s"):
        return float(text[:-1])
    hours, minutes, secs = (int(part) for part in text.split(":"))
    return 3600 * hours + 60 * minutes + secs


def replay(model: str, scale: float, splits: str, epochs: int) -> dict[int, tuple[float, float]]:
    """(round in simulated seconds, simulated samples/s) per N of one `gpumux tune`."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("GPUMUX_")}
    env.update(GPUMUX_SIMULATED_GPU=model, GPUMUX_SIMULATED_TIME_SCALE=str(scale), COLUMNS="200")
    trial = [sys.executable, "-m", "gpumux.devices.simulated.trial", f"--epochs={epochs}"]
    command = [sys.executable, "-m", "gpumux", "tune", "--splits", splits, "--", *trial]
    console.print(f"$ GPUMUX_SIMULATED_GPU={model} GPUMUX_SIMULATED_TIME_SCALE={scale} ", end="")
    console.print(" ".join(command[1:]), markup=False)
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"gpumux tune failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    rounds = {}
    for match in ROUND.finditer(done.stdout):
        split, succeeded, trials = (int(match[i]) for i in (1, 2, 3))
        if succeeded != trials:
            raise SystemExit(f"N={split}: {succeeded}/{trials} succeeded:\n{done.stdout}")
        simulated = seconds(match[4]) / scale
        rounds[split] = (simulated, float(match[5].replace(",", "")) / simulated)
    return rounds


def cpu_seconds() -> float:
    """CPU time of this process's waited-for children so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def crowd(model_name: str, count: int) -> None:
    """K simulated trials at once, no daemon: their start and running cost on this host."""
    model = load_model(model_name)
    compute_s = 30.0
    samples = model.per_trial(count) * compute_s
    with tempfile.TemporaryDirectory(prefix="gpumux-crowd-") as directory:
        write_device(directory, Device(model=model, time_scale=1.0))
        trial = [sys.executable, "-m", "gpumux.devices.simulated.trial"]
        # The trials' own start (interpreter and imports), apart from the model's start-up.
        before = cpu_seconds()
        started = time.monotonic()
        bare = [
            subprocess.Popen([*trial, "--help"], stdout=subprocess.DEVNULL) for _ in range(count)
        ]
        for process in bare:
            process.wait()
        start_cpu = (cpu_seconds() - before) / count
        start_wall = time.monotonic() - started
        before = cpu_seconds()
        started = time.monotonic()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        processes = [
            subprocess.Popen(
                [*trial, f"--samples={samples}", f"--state={directory}"],
                env=env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
            )
            for _ in range(count)
        ]
        most = 0
        while any(process.poll() is None for process in processes):
            most = max(most, census(directory).computing)
            time.sleep(0.2)
        wall = time.monotonic() - started
        run_cpu = cpu_seconds() - before
        codes = {process.returncode for process in processes}
    expected = model.startup_seconds(count) + compute_s
    console.print(
        f"{count} simulated trials of {model.name}: exit codes {sorted(codes)}; at most {most} "
        f"computing at once\n"
        f"  starting one interpreter with the trial's imports: {start_cpu * 1000:.0f} ms of CPU "
        f"each ({count} at once: {start_wall:.1f} s)\n"
        f"  the run: {wall:.1f} s (the model: {expected:.1f} s of start-up crowded on "
        f"{model.cores} cores and {compute_s:g} s of steps), {run_cpu:.1f} CPU s in all: "
        f"{run_cpu / wall:.0%} of one core, {run_cpu / count / wall:.2%} per trial"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="h200-torch-mlp", help="a model file or shipped name")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--splits", default="1,2,3,5,8,13,21,34")
    parser.add_argument("--epochs", default="3,10", help="trial lengths, as torch_mlp's epochs")
    parser.add_argument("--crowd", type=int, help="start this many trials at once, no daemon")
    args = parser.parse_args()
    console.print(f"$ python benchmarks/simulated_gpu.py {' '.join(sys.argv[1:])}".rstrip())
    if args.crowd:
        crowd(args.model, args.crowd)
        return
    model = load_model(args.model)
    console.print(
        f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"simulated {model.name}: startup {model.startup_s:g} s, {model.cores} cores, "
        f"{model.epoch_samples:,} samples per epoch"
    )
    measured = MEASURED_H200 if model.name == H200_MODEL else {}
    table = Table(title=f"gpumux tune on the simulated {model.name} (time x{args.time_scale:g})")
    for column in ("epochs", "N", "round s", "measured samples/s", "simulated samples/s", "ratio"):
        table.add_column(column, justify="right")
    ratios = []
    for epochs in (int(e) for e in args.epochs.split(",")):
        rounds = replay(args.model, args.time_scale, args.splits, epochs)
        for split, (round_s, simulated) in sorted(rounds.items()):
            real = measured.get(epochs, {}).get(split)
            ratio = None if real is None else simulated / real
            if ratio is not None:
                ratios.append(ratio)
            table.add_row(
                str(epochs),
                str(split),
                f"{round_s:.1f}",
                "-" if real is None else f"{real:,}",
                f"{simulated:,.0f}",
                "-" if ratio is None else f"{ratio:.2f}",
            )
    console.print(table)
    if ratios:
        worst = max(ratios, key=lambda r: abs(r - 1))
        console.print(
            f"{len(ratios)} measured points: ratios {min(ratios):.2f} to {max(ratios):.2f}; "
            f"worst {abs(worst - 1):.0%} off"
        )


if __name__ == "__main__":
    main()
