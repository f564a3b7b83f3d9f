"""Adaptive sweeps through the API: stored with a budget and no trial; bad searches, pruners
and steps refused with the reason, nothing stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from builders import sweep_body
from test_sweeps import sweep_count
from test_trials import report, running_trial

from gpumux.storage.engine import Sessions


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
