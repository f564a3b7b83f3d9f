"""How long `gpumux tune` leaves the simulated GPU with no trial computing.

    python benchmarks/tune_idle.py [--model h200-torch-mlp] [--time-scale 0.25]
                                   [--splits 1,2,3,5,8,13,21,34] [--epochs 3]

Runs the real `gpumux tune --splits ... -- python -m gpumux.devices.simulated.trial --epochs E`
on the simulated GPU (its own daemon, as tune always does, in a fresh temporary directory) and
reads the device's state directory every 20 ms: how many trial processes start and how many
compute. It prints the idle share (no trial computing) over the whole command and from the first
trial computing to the last one's end (the first round's start-up, which no order of rounds can
hide, left out), and each idle stretch of at least a second: where the device waited between N.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpumux.devices.simulated.state import census

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_S = 0.02
SHOWN_GAP_S = 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="h200-torch-mlp")
    parser.add_argument("--time-scale", type=float, default=0.25)
    parser.add_argument("--splits", default="1,2,3,5,8,13,21,34")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tune-idle-") as scratch:
        env = {name: v for name, v in os.environ.items() if not name.startswith("GPUMUX_")}
        env.update(
            GPUMUX_SIMULATED_GPU=args.model,
            GPUMUX_SIMULATED_TIME_SCALE=str(args.time_scale),
            GPUMUX_HOME=os.path.join(scratch, "home"),
            TMPDIR=scratch,
            COLUMNS="100",
        )
        trial = [sys.executable, "-m", "gpumux.devices.simulated.trial", f"--epochs={args.epochs}"]
        command = [sys.executable, "-m", "gpumux", "tune", "--splits", args.splits, "--", *trial]
        print("$", " ".join(command[1:3]), *command[3:], flush=True)
        start = time.monotonic()
        tuner = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        # (time since start, computing) at each look at the device.
        looks: list[tuple[float, int]] = []
        while tuner.poll() is None:
            directories = glob.glob(os.path.join(scratch, "gpumux-simulated-*"))
            computing = sum(census(d).computing for d in directories)
            looks.append((time.monotonic() - start, computing))
            time.sleep(SAMPLE_S)
        out = tuner.communicate()[0]
    rounds = [line for line in out.splitlines() if line.startswith("N=")]
    print("\n".join(rounds))
    report(looks, time_scale=args.time_scale)
    if tuner.returncode != 0:
        raise SystemExit(f"gpumux tune exited with {tuner.returncode}")


def report(looks: list[tuple[float, int]], *, time_scale: float) -> None:
    """Idle shares and the idle stretches, from the looks at the device."""
    total = looks[-1][0]
    busy = [at for at, computing in looks if computing]
    if not busy:
        print("no trial was ever seen computing")
        return
    first, last = busy[0], busy[-1]
    idle_all = idle_within = 0.0
    gaps, gap_start = [], None
    for (at, computing), (after, _) in zip(looks, looks[1:], strict=False):
        step = after - at
        if computing:
            if gap_start is not None and at - gap_start >= SHOWN_GAP_S:
                gaps.append((gap_start, at))
            gap_start = None
            continue
        idle_all += step
        if first <= at < last:
            idle_within += step
            gap_start = at if gap_start is None else gap_start
    print(f"run {total:.1f} s real ({total / time_scale:.0f} simulated s), time x{time_scale}")
    print(f"idle (no trial computing): {idle_all / total:.1%} of the whole run")
    print(
        f"idle from the first trial computing ({first:.1f} s) to the last ({last:.1f} s): "
        f"{idle_within / (last - first):.1%}"
    )
    for begin, end in gaps:
        print(f"  idle {begin:.1f}-{end:.1f} s ({end - begin:.1f} s)")


if __name__ == "__main__":
    main()
