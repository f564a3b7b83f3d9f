"""Adaptive sweeps through the API: stored with a budget and no trial; bad searches, pruners
and steps refused with the reason, nothing stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import optuna
import pytest
from builders import sweep_body
from test_sweeps import sweep_count
from test_trials import report, running_trial

from gpumux.search.studies import build
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Sweep


def test_an_adaptive_sweep_is_stored_with_its_budget_and_no_trial_yet(
    api: httpx.Client, tmp_path: Path
) -> None:
    created = api.post(
        "/sweeps",
        json=sweep_body(
            tmp_path,
            "lr=1e-4..1e-1",
            "bs=32,64",
            search="tpe",
            trials=12,
            objective="val_loss:min",
            prune="asha:min_resource=2,reduction_factor=3",
            seed=11,
        ),
    )
    assert created.status_code == 201, created.text
    sweep = created.json()
    assert (sweep["search"], sweep["prune"], sweep["trials"], sweep["seed"]) == (
        "tpe",
        "asha:min_resource=2,reduction_factor=3",
        12,
        11,
    )
    assert sweep["trial_count"] == 12 and sweep["counts"] == {} and sweep["status"] == "queued"
    assert api.get(f"/sweeps/{sweep['id']}/trials").json()["count"] == 0


def test_the_samplers_options_are_stored_after_the_method_and_rebuild_its_sampler(
    api: httpx.Client, sessions: Sessions, tmp_path: Path
) -> None:
    body = sweep_body(
        tmp_path,
        "lr=1e-4..1e-1",
        search="TPE:n_startup_trials=4,multivariate=false,n_ei_candidates=1e1",
        trials=12,
        objective="loss:min",
    )
    created = api.post("/sweeps", json=body)
    assert created.status_code == 201, created.text
    sweep = created.json()
    assert sweep["search"] == "tpe"
    # Typed as the sampler takes them: whole numbers (1e1 too) and a bool.
    options = {"n_startup_trials": 4, "multivariate": False, "n_ei_candidates": 10}
    assert sweep["search_options"] == options
    assert api.get(f"/sweeps/{sweep['id']}").json()["search_options"] == options
    # As a daemon started afresh builds it, from what the database kept.
    with sessions.read() as session:
        stored = session.get(Sweep, sweep["id"])
        assert stored is not None
        sampler = build(session, stored).study.sampler
    assert isinstance(sampler, optuna.samplers.TPESampler)
    assert (sampler._n_startup_trials, sampler._multivariate) == (4, False)
    assert sampler._n_ei_candidates == 10
    # What gpumux sets and the sweep did not: kept.
    assert sampler._constant_liar is True


def test_the_samplers_options_may_come_apart_from_the_method(
    api: httpx.Client, tmp_path: Path
) -> None:
    body = sweep_body(tmp_path, "lr=1e-4..1e-1", search="qmc", trials=4, objective="loss:min")
    created = api.post("/sweeps", json=body | {"search_options": {"qmc_type": "halton"}})
    assert created.status_code == 201, created.text
    assert created.json()["search_options"] == {"qmc_type": "halton"}


def test_grid_and_random_keep_their_defaults(api: httpx.Client, tmp_path: Path) -> None:
    grid = api.post("/sweeps", json=sweep_body(tmp_path, "x=1,2")).json()
    drawn = api.post("/sweeps", json=sweep_body(tmp_path, "x=1..9", trials=3)).json()
    assert (grid["search"], grid["trial_count"]) == ("grid", 2)
    assert (drawn["search"], drawn["trial_count"]) == ("random", 3)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"search": "annealing", "trials": 4}, "Input should be 'grid'"),
        ({"search": "tpe"}, "--search tpe needs a budget of trials: add --trials K"),
        ({"search": "tpe", "trials": 4, "objective": None}, "learns from each trial's objective"),
        ({"search": "grid", "trials": 4}, "--search grid runs every point of the grid"),
        ({"prune": "median", "objective": None}, "--prune median compares trials on the objective"),
        ({"prune": "sometimes"}, "unknown pruner 'sometimes'; use none, median, asha or hyperband"),
        ({"prune": "asha:speed=3"}, "asha has no option 'speed'; its options: min_resource"),
        ({"prune": "asha:min_resource"}, "pruner option 'min_resource' is not NAME=VALUE"),
        (
            {"prune": "hyperband:max_resource=0"},
            "hyperband:max_resource (the last step) must be at least min_resource (1)",
        ),
        ({"prune": "asha:min_resource=1e400"}, "asha:min_resource takes a whole number from 0"),
        (
            {"search": "cmaes", "trials": 4, "params": ["lr=1e-4..1e-1", "bs=32,64"]},
            "--search cmaes takes only numeric ranges, and bs is a choice of values",
        ),
        (
            {"search": "tpe", "trials": 4, "params": ["opt=adam"]},
            "--search tpe has nothing to search",
        ),
        (
            {"search": "tpe:startup=4", "trials": 4},
            "--search tpe has no option 'startup'; its options: consider_prior, prior_weight, "
            "consider_magic_clip, consider_endpoints, n_startup_trials, n_ei_candidates, "
            "multivariate, group, warn_independent_sampling, constant_liar",
        ),
        (
            {"search": "tpe:n_startup_trials=2.5", "trials": 4},
            "--search tpe:n_startup_trials takes a whole number from 0 to 2,147,483,647; "
            "e.g. tpe:n_startup_trials=4",
        ),
        (
            {"search": "tpe:n_startup_trials=-1", "trials": 4},
            "--search tpe:n_startup_trials takes a whole number from 0",
        ),
        (
            {"search": "tpe:multivariate=yes", "trials": 4},
            "--search tpe:multivariate takes true or false; e.g. tpe:multivariate=true",
        ),
        (
            {"search": "gp", "search_options": {"n_startup_trials": True}, "trials": 4},
            "--search gp:n_startup_trials takes a whole number",
        ),
        (
            {"search": "cmaes:sigma0=nan", "trials": 4},
            "--search cmaes:sigma0 takes a finite number",
        ),
        ({"search": "tpe:seed=3", "trials": 4}, "--search tpe: the seed is --seed, not an option"),
        ({"search": "tpe:n_startup_trials", "trials": 4}, "is not NAME=VALUE"),
        (
            {"search": "tpe:n_startup_trials=4,n_startup_trials=5", "trials": 4},
            "--search option n_startup_trials given twice; keep one",
        ),
        (
            {"search": "tpe:n_startup_trials=4", "search_options": {"group": True}, "trials": 4},
            "the sampler's options are given twice",
        ),
        (
            {"search": "qmc:qmc_type=sobel", "trials": 4},
            "--search qmc:qmc_type=sobel: The `qmc_type='sobel'` is invalid. Choose either",
        ),
        (
            {"search": "tpe:consider_prior=false", "trials": 4},
            "--search tpe:consider_prior=false: Optuna says: `consider_prior` has been deprecated",
        ),
        (
            {"search": "random:seed=3", "trials": 4},
            "--search random takes no options (its draws are seeded by --seed)",
        ),
        ({"search": "grid:x=1"}, "--search grid takes no options"),
        ({"search": "tpe:" + "x=1," * 60 + "y=2", "trials": 4}, "search takes at most 200"),
    ],
)
def test_a_search_or_pruner_that_cannot_work_is_refused_and_nothing_stored(
    api: httpx.Client, tmp_path: Path, fields: dict[str, Any], reason: str
) -> None:
    sweep = sweep_body(tmp_path, "lr=1e-4..1e-1", objective="loss:min")
    sweep.update(fields)
    before = sweep_count(api)
    refused = api.post("/sweeps", json={k: v for k, v in sweep.items() if v is not None})
    assert refused.status_code == 422 and reason in refused.text, refused.text
    assert sweep_count(api) == before
    assert len(refused.json()["detail"]) < 400, refused.text


@pytest.mark.parametrize("step", [-1, 2.5, "3", True, 2**31])
def test_a_report_with_a_step_that_is_not_a_count_is_refused(
    api: httpx.Client, sessions: Sessions, tmp_path: Path, step: object
) -> None:
    trial_id = running_trial(sessions, tmp_path)
    bad = report(trial_id) | {"step": step}
    refused = api.post("/reports", json=bad, headers={"Authorization": "Bearer tok"})
    assert refused.status_code == 422 and "step" in refused.text, refused.text
    assert api.get(f"/trials/{trial_id}/reports").json()["count"] == 0
    good = api.post("/reports", json=report(trial_id), headers={"Authorization": "Bearer tok"})
    assert good.status_code == 204
    assert api.get(f"/trials/{trial_id}").json()["step"] == 0
