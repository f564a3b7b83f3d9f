"""A simulated trial: sleeps through its start-up and its steps as its device's model says.

    python -m gpumux.devices.simulated.trial (--seconds T | --epochs E | --samples S)
                                             [--epoch-samples S] [--memory-mb MB] [--state DIR]

Run as a gpumux trial on a simulated GPU (GPUMUX_SIMULATED_GPU), it finds its device from
CUDA_VISIBLE_DEVICES (gpumux.devices.simulated.state), then:
1. starts up: `startup_s` of one core's work, at the share of a core it gets while more trial
   processes are active on the device than the model has cores; the real time its process
   took to get here (the interpreter, gpumux's bootstrap) counts as part of it, as it did on
   the measured host;
2. allocates: when what it holds inside its slice (`--memory-mb`, default the model's
   `per_process_mb`, less `context_mb`) exceeds GPUMUX_MEMORY_LIMIT_MB, or the device's
   memory left, it fails as PyTorch does (`torch.OutOfMemoryError: CUDA out of memory`, exit
   1), which is how gpumux recognises an out-of-memory trial; launched ahead by `gpumux tune`
   (GPUMUX_GATE), it then waits, ready, for the round before to end (gpumux.runtime.gate);
3. computes its samples at aggregate(N) / N samples/s, N the trials computing on the device,
   looked up again every TICK_S, and reports each epoch (`--epoch-samples`, default the model's
   `epoch_samples`) as a line, `GPUMUX_REPORT {"step": e, "samples": ..., "pool_mb": ...}`
   (its allocation, as the runtime reports PyTorch's pool): the split search measures it as it
   measures a real trial. A line in the log is never lost, where an HTTP
   report may be dropped by a host too loaded to deliver it in time. The line before it says
   when the epoch ended on the trial's monotonic clock, which the daemon's stamp on the report
   follows a poll later or more.
Its work is `--samples`, `--epochs` epochs, or what one trial alone computes in
`--seconds` less its start-up (`--seconds` is its duration alone, start-up included). Simulated
seconds last `time_scale` real seconds. SIGTERM ends it as it ends a real one, after it left
the device. Parameters a sweep appends (`--lr=...`) are accepted and ignored.

Standard library only: 34 of them start at once on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from types import FrameType

from gpumux.devices.simulated.model import DeviceModel, ModelError
from gpumux.devices.simulated.state import (
    COMPUTING,
    STARTING,
    Device,
    Entry,
    census,
    device_dir,
    read_device,
)
from gpumux.runtime import gate

# Real seconds between two looks at how many trials share the device: the rate follows N within
# this much of a change (34 trials looking 5 times a second cost a few ms of CPU per second).
TICK_S = 0.2
EXIT_USAGE = 2
EXIT_OUT_OF_MEMORY = 1


class Stopped(Exception):
    """SIGTERM arrived: leave the device, then die of the signal."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m gpumux.devices.simulated.trial", description=__doc__.splitlines()[0]
    )
    work = parser.add_mutually_exclusive_group(required=True)
    work.add_argument("--seconds", type=float, help="duration alone on the device, start-up in")
    work.add_argument("--epochs", type=int, help="epochs of the model's epoch_samples")
    work.add_argument("--samples", type=float, help="samples to compute")
    parser.add_argument("--epoch-samples", type=int, help="samples between two reports")
    parser.add_argument("--memory-mb", type=int, help="held on the GPU (default per_process_mb)")
    parser.add_argument("--state", help="the device's state directory (default: from its UUID)")
    args, _sweep_params = parser.parse_known_args(argv)
    return args


def work_samples(args: argparse.Namespace, model: DeviceModel) -> float:
    """The samples this trial computes, from whichever of its options was given."""
    if args.samples is not None:
        total = float(args.samples)
    elif args.epochs is not None:
        total = float(args.epochs * epoch_size(args, model))
    else:
        total = model.per_trial(1) * (args.seconds - model.startup_s)
    if not total > 0 or epoch_size(args, model) < 1:
        raise ModelError(
            f"no work to do: --seconds must exceed the model's startup_s ({model.startup_s:g}), "
            "--epochs, --samples and --epoch-samples must be above 0"
        )
    return total


def epoch_size(args: argparse.Namespace, model: DeviceModel) -> int:
    """Samples between two reports."""
    return model.epoch_samples if args.epoch_samples is None else args.epoch_samples


def seconds_since_exec() -> float:
    """Real seconds since this process started (Linux's /proc); 0 when they cannot be read."""
    try:
        with open("/proc/self/stat") as stat:
            started = int(stat.read().rpartition(")")[2].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as uptime:
            now = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, now - started)


def start_up(model: DeviceModel, scale: float, directory: str) -> None:
    """Sleep through what is left of `startup_s` of one core's work, at the share of a core
    this trial gets."""
    left = model.startup_s - seconds_since_exec() / scale
    last = time.monotonic()
    while left > 0:
        share = model.startup_share(census(directory).active)
        time.sleep(min(TICK_S, left / share * scale))
        now = time.monotonic()
        left -= (now - last) / scale * share
        last = now


def out_of_memory(model: DeviceModel, memory_mb: int, directory: str) -> str | None:
    """PyTorch's message when this trial's allocation does not fit; None when it does."""
    allocation = memory_mb - model.context_mb
    limit = os.environ.get("GPUMUX_MEMORY_LIMIT_MB")
    others = sum(mb for pid, mb in census(directory).memory if pid != os.getpid())
    free = model.memory_mb - others - model.context_mb
    if limit is not None and limit.isdigit() and allocation > int(limit):
        why = f"this process has exceeded its limit of {int(limit)} MiB (GPUMUX_MEMORY_LIMIT_MB)"
    elif allocation > free:
        why = f"GPU 0 has {max(0, free)} MiB free"
    else:
        return None
    return (
        "Traceback (most recent call last):\n"
        '  File "gpumux/devices/simulated/trial.py", in allocate\n'
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {allocation} MiB. "
        f"GPU 0 has a total capacity of {model.memory_mb} MiB; {why}. (simulated)\n"
    )


def report(step: int, samples: float, *, at: float, pool_mb: int) -> None:
    """One epoch's lines on stdout: when it ended on the trial's clock, then its report."""
    print(f"epoch {step} ended at {at:.3f} s (monotonic)")
    line = {"step": step, "samples": samples, "pool_mb": pool_mb}
    print("GPUMUX_REPORT " + json.dumps(line), flush=True)


def compute(
    model: DeviceModel, scale: float, directory: str, total: float, epoch: int, *, pool_mb: int
) -> None:
    """Sleep through `total` samples at this trial's share of the device, epoch by epoch, its
    allocation `pool_mb` in its slice."""
    done = 0.0
    step = 0
    last = time.monotonic()
    while done < total:
        boundary = min(total, (step + 1) * epoch)
        rate = model.per_trial(max(1, census(directory).computing))
        time.sleep(min(TICK_S, (boundary - done) / rate * scale))
        now = time.monotonic()
        before = done
        done = min(total, done + (now - last) / scale * rate)
        while step * epoch < done and (end := min(total, (step + 1) * epoch)) <= done:
            # A sleep that overran its tick still ended the epoch when the rate did.
            at = last + (end - before) / rate * scale
            report(step, end - step * epoch, at=at, pool_mb=pool_mb)
            step += 1
        last = now


def run(args: argparse.Namespace, device: Device, directory: str) -> int:
    """Start up, allocate and compute on the device; the exit status."""
    model, scale = device.model, device.time_scale
    memory_mb = model.per_process_mb if args.memory_mb is None else args.memory_mb
    total = work_samples(args, model)
    entry = Entry(directory, os.getpid())
    entry.enter(STARTING, 0)
    try:
        start_up(model, scale, directory)
        failure = out_of_memory(model, memory_mb, directory)
        if failure is not None:
            sys.stderr.write(failure)
            return EXIT_OUT_OF_MEMORY
        # Launched ahead by gpumux tune: ready, it waits for the round before to end.
        gate.wait_for_turn()
        entry.move(COMPUTING, memory_mb)
        compute(
            model,
            scale,
            directory,
            total,
            epoch_size(args, model),
            pool_mb=max(0, memory_mb - model.context_mb),
        )
    finally:
        entry.leave()
    return 0


def _stop(signum: int, frame: FrameType | None) -> None:
    raise Stopped()


def main(argv: Sequence[str] | None = None) -> int:
    """The simulated trial's exit status (SIGTERM: it dies of the signal)."""
    args = parse_args(argv)
    directory = args.state or device_dir(os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    signal.signal(signal.SIGTERM, _stop)
    try:
        return run(args, read_device(directory), directory)
    except ModelError as error:
        sys.stderr.write(f"simulated trial: {error}\n")
        return EXIT_USAGE
    except OSError as error:
        sys.stderr.write(f"simulated trial: cannot appear on the device in {directory}: {error}\n")
        return EXIT_USAGE
    except Stopped:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return 128 + signal.SIGTERM


if __name__ == "__main__":
    sys.exit(main())
