"""Statuses of sweeps and trials and the moves between them: light, for the CLI to import."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class TrialStatus(StrEnum):
    queued = "queued"
    starting = "starting"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    lost = "lost"
    # Stopped by the sweep's pruner after a report: a decision, not a failure.
    pruned = "pruned"

    @property
    def is_final(self) -> bool:
        return self in FINAL_TRIAL_STATUSES


class NodeState(StrEnum):
    """Where a node daemon stands in the cluster that shares its database."""

    # Registered, its lease renewed by heartbeat: it claims and runs trials.
    active = "active"
    # Stopped of its own accord; its trials were requeued or finished.
    left = "left"
    # Its lease expired unrenewed (a crash, a freeze, a partition); its trials were requeued.
    lost = "lost"


FINAL_TRIAL_STATUSES = frozenset(
    {
        TrialStatus.succeeded,
        TrialStatus.failed,
        TrialStatus.cancelled,
        TrialStatus.lost,
        TrialStatus.pruned,
    }
)
ACTIVE_TRIAL_STATUSES = frozenset({TrialStatus.starting, TrialStatus.running})

# The only moves a trial may make; lifecycle.set_trial_status refuses any other.
# running -> queued is a requeue: the attempt was cut off (daemon stopped) and is run again.
TRIAL_TRANSITIONS: dict[TrialStatus, frozenset[TrialStatus]] = {
    TrialStatus.queued: frozenset({TrialStatus.starting, TrialStatus.cancelled}),
    TrialStatus.starting: frozenset(
        {
            TrialStatus.running,
            TrialStatus.failed,
            TrialStatus.cancelled,
            TrialStatus.queued,
            TrialStatus.lost,
            TrialStatus.pruned,
        }
    ),
    TrialStatus.running: frozenset(
        {
            TrialStatus.succeeded,
            TrialStatus.failed,
            TrialStatus.cancelled,
            TrialStatus.lost,
            TrialStatus.queued,
            TrialStatus.pruned,
        }
    ),
    TrialStatus.succeeded: frozenset(),
    TrialStatus.failed: frozenset(),
    TrialStatus.cancelled: frozenset(),
    TrialStatus.lost: frozenset(),
    TrialStatus.pruned: frozenset(),
}


class SweepStatus(StrEnum):
    queued = "queued"
    running = "running"
    finished = "finished"
    cancelled = "cancelled"


class SearchMethod(StrEnum):
    """How a sweep's trials are chosen: expanded at submission (grid, random) or asked of an
    Optuna sampler as slots free (the others)."""

    grid = "grid"
    random = "random"
    tpe = "tpe"
    gp = "gp"
    cmaes = "cmaes"
    qmc = "qmc"

    @property
    def adaptive(self) -> bool:
        return self not in (SearchMethod.grid, SearchMethod.random)


class ObjectiveMode(StrEnum):
    min = "min"
    max = "max"


_PRUNE_NOTE = re.compile(r"pruned at step (\d+) by the (\S+) pruner \((.+) (\S+)\)")


@dataclass(frozen=True)
class PruneNote:
    """Why the pruner stopped a trial, as its error records it: the step (from 0) whose objective
    lost, the pruner (its spec) and that value. One home for the wording the CLI reads back."""

    step: int
    pruner: str
    metric: str
    value: float

    def __str__(self) -> str:
        return (
            f"pruned at step {self.step} by the {self.pruner} pruner "
            f"({self.metric} {self.value:.6g})"
        )

    @classmethod
    def parse(cls, error: str | None) -> PruneNote | None:
        """The note in a trial's error; None for any other error."""
        found = _PRUNE_NOTE.fullmatch(error or "")
        if found is None:
            return None
        step, pruner, metric, value = found.groups()
        try:
            return cls(step=int(step), pruner=pruner, metric=metric, value=float(value))
        except ValueError:
            return None

    @property
    def pruner_name(self) -> str:
        """The pruner without its options: "asha" for "asha:min_resource=2"."""
        return self.pruner.partition(":")[0]
