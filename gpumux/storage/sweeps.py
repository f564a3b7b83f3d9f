"""Sweeps: their creation with their queued trials."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from gpumux.schemas import SweepCreate, parse_objective
from gpumux.status import ObjectiveMode, SearchMethod
from gpumux.storage.models import Owner, Sweep, Trial, utcnow


def create_sweep(
    *,
    session: Session,
    sweep_in: SweepCreate,
    owner: Owner,
    seed: int,
    trial_params: Sequence[dict[str, Any]],
    search: SearchMethod = SearchMethod.grid,
    search_options: dict[str, Any] | None = None,
    prune: str | None = None,
) -> Sweep:
    """A sweep and its queued trials, in the caller's transaction. An adaptive search's trials
    are asked as slots free: none is stored now, and its budget is `sweep_in.trials`."""
    metric, mode = parse_objective(sweep_in.objective) if sweep_in.objective else (None, None)
    sweep = Sweep(
        name=sweep_in.name,
        owner=owner,
        owner_id=owner.id,
        command=sweep_in.command,
        param_tokens=sweep_in.params,
        workdir=sweep_in.workdir,
        env=sweep_in.env,
        random_trials=sweep_in.trials,
        search=search,
        search_options=search_options or None,
        prune=prune,
        seed=seed,
        split=None if sweep_in.split == "auto" else sweep_in.split,
        objective_metric=metric,
        objective_mode=ObjectiveMode(mode) if mode else None,
        time_limit_s=sweep_in.time_limit_s,
        retries=sweep_in.retries,
        priority=sweep_in.priority,
        warm=sweep_in.warm,
        trial_count=sweep_in.trials or 0 if search.adaptive else len(trial_params),
    )
    session.add(sweep)
    session.flush()
    now = utcnow()
    session.add_all(
        Trial(sweep_id=sweep.id, number=number, params=params, queued_at=now)
        for number, params in enumerate(trial_params)
    )
    session.flush()
    return sweep
