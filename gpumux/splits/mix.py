"""What shares a split search's device at one tick: every workload's trials, each holding 1/N."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class Mix:
    """What shares a search's device at one tick, every workload's trials counted."""

    # The sum of 1/split over the trials active on the device: each holds 1/N of it.
    shares: Fraction
    # The workload's own trials there launched under another N (left from the last N).
    stale: int = 0
    # Whether a trial waits for a slot, and whether one would fit in the share left.
    waiting: bool = True
    fitting: bool = True
    # Whether another workload's trial waits for more than the share left: it may hold the
    # device reserved (placement's rule for a trial that fits nowhere), not memory.
    reserved: bool = False
    # Whether `queued` counts every trial of the workload that waits (the line was read whole).
    counted: bool = True
    # Whether the workload, alone on the device, runs N trials there counting those left from a
    # lower N (`stale`): its credit let the new N's start beside them (scheduling.placement),
    # so N trials share the device, and a phase may measure the new N's trials among them.
    raised: bool = False

    @property
    def full(self) -> bool:
        """Whether the device holds all it can: every share taken, or none that waits fits."""
        return self.shares >= 1 or (self.waiting and not self.fitting)

    @classmethod
    def alone(cls, *, running: int, queued: int, split: int) -> Mix:
        """The workload's trials alone on the device: `running` of them, `queued` waiting."""
        return cls(
            shares=Fraction(min(running, split), split),
            stale=max(0, running - split),
            waiting=queued > 0,
            fitting=queued > 0,
        )


def raised(splits: Mapping[int, int], *, split: int, shares: Fraction) -> bool:
    """Whether a workload's trials on a device, counted by the N each was launched under
    (`splits`), are `split` of them, some left from a lower N and none from a higher, with
    nothing else there (`shares`: the sum of 1/N over every trial on the device)."""
    lower = sum(n for launched, n in splits.items() if launched < split)
    return (
        lower > 0
        and all(launched <= split for launched, n in splits.items() if n)
        and sum(splits.values()) >= split
        and shares == sum(Fraction(n, launched) for launched, n in splits.items())
    )
