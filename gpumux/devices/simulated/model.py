"""A simulated GPU's contention model: what one measured device and workload do at each N.

A model is a JSON object anyone can write from a measurement (`gpumux tune`, or a training's
own per-step rates), read by `parse_model`:

- `name`: the GPU's name as NVML reports it (the simulated device shows it with "(simulated)").
- `memory_mb`: the GPU's memory, MiB.
- `cores`: the host's CPU cores. Every trial process wants one: start-up is CPU work (imports,
  the CUDA context) and a launch-bound step keeps a core busy dispatching kernels, so a trial
  starting while more processes are active than there are cores starts that much slower.
- `per_process_mb`: what NVML shows each trial process holding once started.
- `context_mb` (default 0): the part of it outside the trial's memory slice (PyTorch's CUDA
  context); the rest must fit `GPUMUX_MEMORY_LIMIT_MB`, or the trial runs out of memory.
- `startup_s`: one trial's start-up alone (interpreter, framework, CUDA context), seconds.
- `throughput`: the device's steady aggregate samples/s while N trials compute, by N
  (`{"1": 92371, "8": 447162}`), start-up excluded; "1" is required. Between the given N it is
  interpolated linearly, beyond the largest it stays at the last value. One trial of N
  computes at aggregate(N) / N.
- `epoch_samples`: samples a trial processes between two reports (an epoch of the workload).
- `about` (optional): where the figures come from.

Pure: the simulated trial imports it, so it imports only the standard library.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

REQUIRED = ("name", "memory_mb", "cores", "per_process_mb", "startup_s", "throughput")
OPTIONAL = ("context_mb", "epoch_samples", "about")
EXAMPLE_THROUGHPUT = '{"1": 92371, "8": 447162, "34": 447123}'


class ModelError(ValueError):
    """A model file that cannot be used; the message names the file, the key and the fix."""


@dataclass(frozen=True)
class DeviceModel:
    """One device and workload: memory, cores, start-up and aggregate throughput by N."""

    name: str
    memory_mb: int
    cores: int
    per_process_mb: int
    startup_s: float
    # (N, aggregate samples/s), N ascending, the first N being 1.
    throughput: tuple[tuple[int, float], ...]
    epoch_samples: int
    context_mb: int = 0
    about: str = ""

    def aggregate(self, n: int) -> float:
        """The device's samples/s while `n` trials compute (n >= 1)."""
        if n < 1:
            raise ValueError(f"aggregate throughput at N={n}: N starts at 1")
        splits = [split for split, _ in self.throughput]
        at = bisect_right(splits, n) - 1
        split, rate = self.throughput[at]
        if split == n or at == len(self.throughput) - 1:
            return rate
        upper, upper_rate = self.throughput[at + 1]
        return rate + (upper_rate - rate) * (n - split) / (upper - split)

    def per_trial(self, n: int) -> float:
        """One trial's samples/s while `n` trials compute."""
        return self.aggregate(n) / n

    def startup_share(self, active: int) -> float:
        """The fraction of a core a starting trial gets while `active` trial processes (itself
        included, starting or computing) want one each."""
        return min(1.0, self.cores / max(1, active))

    def startup_seconds(self, starting: int) -> float:
        """How long each of `starting` trials takes to start when they start at once."""
        return self.startup_s / self.startup_share(starting)

    @property
    def slice_mb(self) -> int:
        """What a trial allocates inside its memory slice."""
        return self.per_process_mb - self.context_mb

    @property
    def best_split(self) -> int:
        """The given N of the highest aggregate throughput (the smallest on a tie)."""
        return max(self.throughput, key=lambda point: (point[1], -point[0]))[0]

    def as_json(self) -> dict[str, Any]:
        """The model as a model file holds it."""
        return {
            "name": self.name,
            "memory_mb": self.memory_mb,
            "cores": self.cores,
            "per_process_mb": self.per_process_mb,
            "context_mb": self.context_mb,
            "startup_s": self.startup_s,
            "throughput": {str(n): rate for n, rate in self.throughput},
            "epoch_samples": self.epoch_samples,
            "about": self.about,
        }


def parse_model(text: str, *, source: str) -> DeviceModel:
    """The model a model file's text describes; ModelError naming `source` when it is not one."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ModelError(f"{source}: not JSON: {error}") from None
    return model_from(data, source=source)


def model_from(data: object, *, source: str) -> DeviceModel:
    """The model a decoded model file describes; ModelError naming `source` when it is not one."""
    if not isinstance(data, dict):
        raise ModelError(f"{source}: expected a JSON object with the keys {', '.join(REQUIRED)}")
    missing = [key for key in REQUIRED if key not in data]
    if missing:
        raise ModelError(f"{source}: missing {', '.join(missing)} (a model needs {REQUIRED})")
    unknown = sorted(set(data) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        known = ", ".join(REQUIRED + OPTIONAL)
        raise ModelError(f"{source}: unknown key {', '.join(unknown)} (known: {known})")
    name = data["name"]
    if not isinstance(name, str) or not name.strip():
        raise ModelError(f'{source}: name must be the GPU\'s name, e.g. "NVIDIA H200"')
    about = data.get("about", "")
    if not isinstance(about, str):
        raise ModelError(f"{source}: about must be a text")
    memory_mb = _count(data, "memory_mb", source)
    per_process_mb = _count(data, "per_process_mb", source)
    context_mb = _count(data, "context_mb", source, default=0, least=0)
    if context_mb > per_process_mb:
        raise ModelError(
            f"{source}: context_mb ({context_mb}) is part of per_process_mb ({per_process_mb}) "
            "and cannot exceed it"
        )
    if per_process_mb > memory_mb:
        raise ModelError(
            f"{source}: per_process_mb ({per_process_mb}) exceeds the GPU's memory_mb ({memory_mb})"
        )
    throughput = _throughput(data["throughput"], source)
    default_epoch = max(1, round(throughput[0][1]))
    return DeviceModel(
        name=name,
        memory_mb=memory_mb,
        cores=_count(data, "cores", source),
        per_process_mb=per_process_mb,
        context_mb=context_mb,
        startup_s=_seconds(data["startup_s"], source),
        throughput=throughput,
        epoch_samples=_count(data, "epoch_samples", source, default=default_epoch),
        about=about,
    )


def _count(data: dict[str, Any], key: str, source: str, *, default: int = 0, least: int = 1) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ModelError(
            f"{source}: {key} must be a whole number of at least {least}, got {value!r}"
        )
    return value


def _seconds(value: object, source: str) -> float:
    number = _number(value)
    if number is None or number < 0:
        raise ModelError(f"{source}: startup_s must be a number of seconds >= 0, got {value!r}")
    return number


def _number(value: object) -> float | None:
    """A JSON number as a float; None for anything else (true and false included)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _throughput(value: object, source: str) -> tuple[tuple[int, float], ...]:
    shape = (
        f"throughput must map N to the device's aggregate samples/s at N, e.g. {EXAMPLE_THROUGHPUT}"
    )
    if not isinstance(value, dict) or not value:
        raise ModelError(f"{source}: {shape}")
    points = []
    for key, rate in value.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and int(key) >= 1):
            raise ModelError(f"{source}: {shape}; {key!r} is not an N of 1 or more")
        number = _number(rate)
        if number is None or number <= 0:
            raise ModelError(f"{source}: {shape}; at N={key}: {rate!r} is not a rate above 0")
        points.append((int(key), number))
    points.sort()
    if points[0][0] != 1:
        raise ModelError(f"{source}: {shape}; N=1 (one trial alone) is required")
    if len({n for n, _ in points}) != len(points):
        raise ModelError(f"{source}: {shape}; an N is given twice")
    return tuple(points)
