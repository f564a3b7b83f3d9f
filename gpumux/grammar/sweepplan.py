"""A sweep as planned: what storage keeps of a submission once every part of it is checked.

`gpumux.search.planning.plan_sweep` makes one from the API's request; the route stores it
(`storage/sweeps.create_sweep`) and the command line checks with it before it contacts the daemon.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gpumux.status import ObjectiveMode, SearchMethod
from gpumux.text import quoted


class Objective(NamedTuple):
    """What ranks a sweep's trials: the metric they report, and whether less or more is better."""

    metric: str
    mode: ObjectiveMode

    def __str__(self) -> str:
        return f"{self.metric}:{self.mode}"


def parse_objective(text: str) -> Objective:
    """The joined form `val_loss:min` that `--objective` (and the API's older `objective`
    field) take, as an Objective; ValueError saying the form."""
    metric, _, mode = text.rpartition(":")
    if not metric or mode not in ObjectiveMode.__members__:
        raise ValueError(
            f"objective {quoted(text)} must be METRIC:min or METRIC:max, e.g. val_loss:min"
        )
    return Objective(metric, ObjectiveMode(mode))


@dataclass(frozen=True)
class SweepPlan:
    """A checked sweep: its fields as stored, and the trials to queue with it."""

    name: str | None
    command: list[str]
    param_tokens: list[str]
    workdir: str
    env: dict[str, str]
    # The trials the submitter asked for: a random search's draws, an adaptive search's
    # budget; None for a grid, whose size is its points.
    trial_budget: int | None
    search: SearchMethod
    search_options: dict[str, Any]
    prune: str | None
    seed: int
    split: int | None  # None: auto, the split search chooses
    metric: str | None
    mode: ObjectiveMode | None
    time_limit_s: float | None
    retries: int
    priority: int
    preload: bool
    # Every trial's parameters, queued at once; none for an adaptive search, which asks its
    # sampler as slots free.
    trial_params: list[dict[str, Any]] = field(default_factory=list)

    @property
    def trial_count(self) -> int:
        """Every trial the sweep will have: the grid or the draws, or the adaptive budget."""
        if self.search.adaptive:
            return self.trial_budget or 0
        return len(self.trial_params)
