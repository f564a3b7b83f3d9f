"""A sweep as planned: what storage keeps of a submission once every part of it is checked.

`gpumux.search.planning.plan_sweep` makes one from the API's request; the route stores it
(`store.create_sweep`) and the command line checks with it before it contacts the daemon.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpumux.fields import quoted
from gpumux.status import ObjectiveMode, SearchMethod


def parse_objective(text: str) -> tuple[str, ObjectiveMode]:
    """ "val_loss:min" -> ("val_loss", min): the one reader of the joined form that
    `--objective` and W&B's tools use; ValueError with the expected form."""
    metric, _, mode = text.rpartition(":")
    if not metric or mode not in ObjectiveMode.__members__:
        raise ValueError(
            f"objective {quoted(text)} must be METRIC:min or METRIC:max, e.g. val_loss:min"
        )
    return metric, ObjectiveMode(mode)


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
    warm: bool
    # Every trial's parameters, queued at once; none for an adaptive search, which asks its
    # sampler as slots free.
    trial_params: list[dict[str, Any]] = field(default_factory=list)

    @property
    def trial_count(self) -> int:
        """Every trial the sweep will have: the grid or the draws, or the adaptive budget."""
        if self.search.adaptive:
            return self.trial_budget or 0
        return len(self.trial_params)
