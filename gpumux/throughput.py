"""A point of a throughput curve and the unit of its throughput: the one shape the split search
measures, profiles store, the API serves and the CLI draws."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Literal, get_args

ThroughputUnit = Literal["samples/s", "steps/s", "trials/s"]
SAMPLES_PER_S: ThroughputUnit = "samples/s"
# For scripts that report no samples but whose optimizer steps the runtime counts (PyTorch).
STEPS_PER_S: ThroughputUnit = "steps/s"
# For scripts that report neither: completed trials.
TRIALS_PER_S: ThroughputUnit = "trials/s"
THROUGHPUT_UNITS: tuple[ThroughputUnit, ...] = get_args(ThroughputUnit)
# How an unsettled profile's reason starts when its sweep ended before the search settled:
# the next sweep of the workload goes on from its curve.
SWEEP_ENDED = "unsettled: the sweep ended"
# A point's fields stored only where measured: a profile from before they were has none.
OPTIONAL = ("trials", "spread", "rate", "startup_s")


def throughput_unit(text: str) -> ThroughputUnit:
    """The unit named by `text`; ValueError naming the units there are."""
    for unit in THROUGHPUT_UNITS:
        if text == unit:
            return unit
    raise ValueError(f"throughput unit {text!r} is not one of {', '.join(THROUGHPUT_UNITS)}")


@dataclass(frozen=True)
class CurvePoint:
    """N trials at once on a device: their aggregate throughput in the curve's unit, and the
    median seconds and the most memory (MiB) one of them took, when measured; how sure it is:
    the trials it was measured on, and the spread of their rates ((max - min) / median).

    Where its trials' reports showed them, also one trial's steady rate while N compute (the
    unit per second) and its start-up (seconds from its start to computing at that rate): from
    them the throughput of N trials that each do a given work, start-up included (`at_work`).
    """

    split: int
    throughput: float
    seconds_per_trial: float | None = None
    memory_per_trial_mb: float | None = None
    trials: int | None = None
    spread: float | None = None
    rate: float | None = None
    startup_s: float | None = None

    def at_work(self, work: float | None) -> CurvePoint:
        """The point for trials that each do `work` (in the unit's count): N of them, each
        starting up and then computing `work` at the steady rate, a trial's life apart; as it is
        where its steady rate or start-up is unknown (or the work)."""
        if work is None or work <= 0 or not self.rate or self.startup_s is None:
            return self
        throughput = self.split * work / (self.startup_s + work / self.rate)
        return replace(self, throughput=throughput) if math.isfinite(throughput) else self

    def to_json(self) -> dict[str, int | float | None]:
        """The point as a JSON object, numbers as floats but for the split and the trials; how
        sure it is only where measured (a point of a profile from before reads the same)."""
        return {
            name: value if name in ("split", "trials") or value is None else float(value)
            for name, value in asdict(self).items()
            if value is not None or name not in OPTIONAL
        }

    @classmethod
    def from_json(cls, data: object) -> CurvePoint:
        """A point from its JSON object (or what came instead), checked: ValueError naming what is
        wrong.

        Points the search makes are measured and sound; what is read or stored is checked.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"a curve point must be an object, not {type(data).__name__}")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"a curve point has no field {', '.join(sorted(unknown))}")
        if "split" not in data or "throughput" not in data:
            raise ValueError(f"a curve point needs a split and a throughput: {dict(data)!r}")
        split = data["split"]
        if isinstance(split, bool) or not isinstance(split, int) or split < 1:
            raise ValueError(f"a curve point's split must be an integer of 1 or more: {split!r}")
        _check("throughput", data["throughput"], above_zero=False)
        for name in ("seconds_per_trial", "memory_per_trial_mb", "spread", "rate", "startup_s"):
            if data.get(name) is not None:
                _check(name, data[name], above_zero=name in ("seconds_per_trial", "rate"))
        trials = data.get("trials")
        if trials is not None and (isinstance(trials, bool) or not isinstance(trials, int)):
            raise ValueError(f"a curve point's trials must be an integer: {trials!r}")
        if trials is not None and trials < 1:
            raise ValueError(f"a curve point's trials must be 1 or more: {trials!r}")
        return cls(**data)


def _check(name: str, value: object, *, above_zero: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"a curve point's {name} must be a finite number: {value!r}")
    if value < 0 or (above_zero and value == 0):
        least = "above 0" if above_zero else "0 or more"
        raise ValueError(f"a curve point's {name} must be {least}: {value!r}")
