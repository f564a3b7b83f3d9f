"""A sweep's one parse: the request, checked whole, becomes the plan that storage keeps.

The daemon plans each submission before storing it. `gpumux sweep` and `gpumux tune` check it
(`check_sweep`) before they contact the daemon, so that both refuse the same sweeps with the
same words; the limits (`max_grid`) are the daemon's settings, which the command line, perhaps
on another host, does not know, so only the daemon applies them.
"""

from __future__ import annotations

from gpumux.grammar import sweepspec
from gpumux.grammar.command import check_placeholders
from gpumux.grammar.sweepplan import SweepPlan
from gpumux.schemas.sweeps import SweepCreate
from gpumux.search import methods


class PlanError(ValueError):
    """A sweep that cannot run as asked; the message says what to change."""


def check_sweep(sweep_in: SweepCreate) -> tuple[list[sweepspec.Param], methods.Search]:
    """Its parameters and its search, or PlanError: what a sweep may not be on any host."""
    try:
        params = sweepspec.parse_params(sweep_in.params)
        check_placeholders(sweep_in.command, [param.name for param in params])
        search = methods.check(
            method=sweep_in.search,
            options=sweep_in.search_options,
            prune=sweep_in.prune,
            trials=sweep_in.trials,
            metric=sweep_in.metric,
            params=params,
        )
    except (sweepspec.SpecError, methods.SearchError) as error:
        raise PlanError(str(error)) from error
    return params, search


def plan_sweep(sweep_in: SweepCreate, *, max_grid: int, seed: int) -> SweepPlan:
    """The sweep to store, its trials expanded; PlanError saying what to change. `seed` is
    the random search's seed where the request gives none; `max_grid` the most trials."""
    if sweep_in.trials is not None and sweep_in.trials > max_grid:
        raise PlanError(
            f"--trials {sweep_in.trials:,} is over the limit of {max_grid:,} trials per sweep"
        )
    if sweep_in.seed is not None:
        seed = sweep_in.seed
    params, search = check_sweep(sweep_in)
    try:
        trial_params = (
            []
            if search.method.adaptive
            else sweepspec.expand(params, trials=sweep_in.trials, seed=seed, max_grid=max_grid)
        )
    except sweepspec.SpecError as error:
        raise PlanError(str(error)) from error
    return SweepPlan(
        name=sweep_in.name,
        command=sweep_in.command,
        param_tokens=sweep_in.params,
        workdir=sweep_in.workdir,
        env=sweep_in.env,
        trial_budget=sweep_in.trials,
        search=search.method,
        search_options=search.options,
        prune=search.prune.text if search.prune else None,
        seed=seed,
        split=None if sweep_in.split == "auto" else sweep_in.split,
        metric=sweep_in.metric,
        mode=sweep_in.mode,
        time_limit_s=sweep_in.time_limit_s,
        retries=sweep_in.retries,
        priority=sweep_in.priority,
        preload=sweep_in.preload,
        trial_params=trial_params,
    )
