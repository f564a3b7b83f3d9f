"""The one plan of a sweep: what the route stores and what the command line checks with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from builders import sweep_in

from gpumux.search.planning import PlanError, plan_sweep
from gpumux.status import ObjectiveMode, SearchMethod


def test_a_grid_is_planned_with_every_trial_and_auto_split_as_none(tmp_path: Path) -> None:
    plan = plan_sweep(
        sweep_in(tmp_path, "x=1..3", "tag=a,b", objective="loss:max"), max_grid=10, seed=5
    )
    assert plan.search is SearchMethod.grid and plan.trial_budget is None
    assert plan.trial_params == [{"x": x, "tag": tag} for x in (1, 2, 3) for tag in ("a", "b")]
    assert plan.trial_count == 6 and plan.split is None and plan.seed == 5
    assert (plan.metric, plan.mode) == ("loss", ObjectiveMode.max)


def test_an_adaptive_search_is_planned_with_its_budget_and_no_trial(tmp_path: Path) -> None:
    sweep = sweep_in(
        tmp_path, "lr=1e-4..1e-1", trials=7, search="tpe:multivariate=false", seed=3,
        objective="loss:min", split=2,
    )  # fmt: skip
    plan = plan_sweep(sweep, max_grid=10, seed=99)
    assert (plan.search, plan.search_options) == (SearchMethod.tpe, {"multivariate": False})
    assert plan.trial_params == [] and plan.trial_budget == plan.trial_count == 7
    assert plan.seed == 3 and plan.split == 2


@pytest.mark.parametrize(
    ("params", "fields", "message"),
    [
        (["x=1..30"], {}, "the grid has 30 trials, over the limit of 10"),
        (["x=1..3"], {"trials": 11}, "--trials 11 is over the limit of 10 trials per sweep"),
        (["lr=a..b"], {}, "lr=a..b: range ends must be numbers"),
        (["x=1..3"], {"search": "tpe", "trials": 4}, "add --objective"),
        (["x=1"], {"command": ["echo", "{y}"]}, "{y} names no parameter"),
        (["x=1"], {"prune": "median"}, "--prune median compares trials on the objective"),
    ],
)
def test_a_sweep_that_cannot_run_is_refused_with_what_to_change(
    tmp_path: Path, params: list[str], fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(PlanError) as refused:
        plan_sweep(sweep_in(tmp_path, *params, **fields), max_grid=10, seed=1)
    assert message in str(refused.value)


def test_a_placeholder_message_names_it_the_parameters_and_the_escape(tmp_path: Path) -> None:
    sweep = sweep_in(tmp_path, "lr=0.1", "bs=32", command=["run", "{lrr}"])
    with pytest.raises(PlanError) as refused:
        plan_sweep(sweep, max_grid=10, seed=1)
    message = str(refused.value)
    assert "{lrr}" in message and "lr, bs" in message and "{{lrr}}" in message
