"""Statuses of sweeps and trials and the moves between them: light, for the CLI to import."""

from __future__ import annotations

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

# The only moves a trial may make; store.set_trial_status refuses any other.
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
