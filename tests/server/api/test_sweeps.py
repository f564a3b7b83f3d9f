from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from builders import sweep_body

from gpumux.config import Settings
from gpumux.splits import curve as split_curve
from gpumux.storage import profiles as profile_store
from gpumux.storage.engine import Sessions


def sweep_count(api: httpx.Client) -> int:
    return int(api.get("/sweeps").json()["count"])


def test_a_sweep_is_stored_with_its_trials(api: httpx.Client, tmp_path: Path) -> None:
    response = api.post(
        "/sweeps", json=sweep_body(tmp_path, "lr=1e-3..1e-1:3", "bs=32,64", name="first")
    )
    assert response.status_code == 201, response.text
    sweep = response.json()
    assert sweep["trial_count"] == 6 and sweep["counts"] == {"queued": 6}
    assert sweep["status"] == "queued" and sweep["split"] == "auto" and sweep["name"] == "first"
    trials = api.get(f"/sweeps/{sweep['id']}/trials").json()
    assert trials["count"] == 6
    assert [t["params"] for t in trials["data"][:2]] == [
        {"lr": 0.001, "bs": 32},
        {"lr": 0.001, "bs": 64},
    ]
    one = api.get(f"/trials/{trials['data'][0]['id']}").json()
    assert one["status"] == "queued" and one["sweep_id"] == sweep["id"]


def test_random_search_is_reproducible_from_the_recorded_seed(
    api: httpx.Client, tmp_path: Path
) -> None:
    first = api.post("/sweeps", json=sweep_body(tmp_path, "lr=1e-4..1e-1", trials=5)).json()
    again = api.post(
        "/sweeps", json=sweep_body(tmp_path, "lr=1e-4..1e-1", trials=5, seed=first["seed"])
    ).json()
    params = [
        [t["params"] for t in api.get(f"/sweeps/{s['id']}/trials").json()["data"]]
        for s in (first, again)
    ]
    assert params[0] == params[1] and len(params[0]) == 5


@pytest.mark.parametrize(
    ("params", "fields", "expected"),
    [
        (["lr=1e-3...1e-1"], {}, "lr=1e-3...1e-1"),
        (["lr="], {}, "lr="),
        (["=3"], {}, "=3"),
        (["lr=a..b"], {}, "lr=a..b"),
        ([], {"command": []}, "command"),
        ([], {"command": [""]}, "first word is empty"),
        ([], {"workdir": "relative/dir"}, "absolute path"),
        ([], {"split": 0}, "split must be 1..64"),
        ([], {"objective": "val_loss"}, "METRIC:min or METRIC:max"),
        ([], {"trials": 0}, "trials"),
        ([], {"owner": "mallory"}, "owner"),
        ([], {"command": ["echo", "a\u0000b"]}, "NUL character"),
        (["x=a\u0000b"], {}, "control character"),
        ([], {"env": {"A=B": "1"}}, "cannot be passed to a process"),
        ([], {"env": {"A": "x\u0000y"}}, "cannot be passed to a process"),
    ],
)
def test_bad_sweeps_are_refused_with_the_reason_and_leave_nothing(
    api: httpx.Client, tmp_path: Path, params: list[str], fields: dict[str, Any], expected: str
) -> None:
    response = api.post("/sweeps", json=sweep_body(tmp_path, *params, **fields))
    assert response.status_code == 422
    assert expected in response.text
    assert sweep_count(api) == 0


def test_the_objective_is_a_metric_and_a_mode_both_ways(api: httpx.Client, tmp_path: Path) -> None:
    body = sweep_body(tmp_path, "x=1,2", metric="val_loss", mode="max")
    sweep = api.post("/sweeps", json=body).json()
    assert (sweep["metric"], sweep["mode"]) == ("val_loss", "max") and "objective" not in sweep
    assert api.get(f"/sweeps/{sweep['id']}").json()["mode"] == "max"
    # The older joined form is still read, into the same two fields.
    older = api.post("/sweeps", json=sweep_body(tmp_path, "x=1", objective="a:b:min")).json()
    assert (older["metric"], older["mode"]) == ("a:b", "min")
    plain = api.post("/sweeps", json=sweep_body(tmp_path, "x=1")).json()
    assert (plain["metric"], plain["mode"]) == (None, None)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"metric": "loss"}, "metric and mode go together"),
        ({"mode": "min"}, "metric and mode go together"),
        ({"metric": "loss", "mode": "least"}, "mode"),
        ({"objective": "loss:min", "metric": "loss"}, "the objective is given twice"),
        ({"objective": 3}, "objective must be text"),
        ({"warm": False}, "warm is now preload: this request comes from an older gpumux"),
    ],
)
def test_a_metric_without_its_mode_is_refused(
    api: httpx.Client, tmp_path: Path, fields: dict[str, Any], expected: str
) -> None:
    response = api.post("/sweeps", json=sweep_body(tmp_path, "x=1", **fields))
    assert response.status_code == 422
    assert expected in response.text
    assert sweep_count(api) == 0


def test_a_grid_over_the_limit_is_refused_with_its_size(
    api: httpx.Client, tmp_path: Path, settings: Settings
) -> None:
    response = api.post("/sweeps", json=sweep_body(tmp_path, "a=1..200", "b=1..100"))
    assert response.status_code == 422
    assert "20,000" in response.text and f"{settings.max_grid:,}" in response.text
    assert sweep_count(api) == 0


@pytest.mark.no_query
def test_malformed_json_names_the_problem(api: httpx.Client) -> None:
    response = api.post(
        "/sweeps",
        content=b'{"command": ["x"], "workdir": ',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 422
    assert "json" in response.text.lower()
    missing = api.post("/sweeps", json={"command": ["x"]})
    assert missing.status_code == 422
    assert any(error["loc"] == ["body", "workdir"] for error in missing.json()["errors"])


@pytest.mark.parametrize(
    ("method", "path", "message"),
    [
        ("GET", "/sweeps/999", "sweep 999 not found"),
        ("POST", "/sweeps/999/cancel", "sweep 999 not found"),
        ("GET", "/sweeps/999/trials", "sweep 999 not found"),
        ("GET", "/trials/998", "trial 998 not found"),
        ("GET", "/trials/998/log", "trial 998 not found"),
        ("GET", "/trials/998/reports", "trial 998 not found"),
    ],
)
def test_unknown_ids_get_404_with_the_id(
    api: httpx.Client, method: str, path: str, message: str
) -> None:
    response = api.request(method, path)
    assert response.status_code == 404
    assert response.json()["detail"] == message


def test_listing_pages_and_filters(api: httpx.Client, tmp_path: Path) -> None:
    ids = [api.post("/sweeps", json=sweep_body(tmp_path, "x=1,2")).json()["id"] for _ in range(5)]
    page = api.get("/sweeps", params={"offset": 1, "limit": 2}).json()
    assert page["count"] == 5 and [s["id"] for s in page["data"]] == ids[::-1][1:3]
    assert api.get("/sweeps", params={"status": "finished"}).json()["count"] == 0
    assert api.get("/sweeps", params={"owner": "nobody-here"}).json()["count"] == 0
    owner = page["data"][0]["owner"]
    assert api.get("/sweeps", params={"owner": owner}).json()["count"] == 5
    assert api.get("/sweeps", params={"limit": 0}).status_code == 422


def test_cancel_records_the_intent(api: httpx.Client, tmp_path: Path) -> None:
    sweep = api.post("/sweeps", json=sweep_body(tmp_path, "x=1,2")).json()
    response = api.post(f"/sweeps/{sweep['id']}/cancel")
    assert response.status_code == 202
    assert response.json()["cancel_requested"] is True
    assert api.get(f"/sweeps/{sweep['id']}").json()["cancel_requested"] is True


@pytest.mark.no_query
def test_the_openapi_document_lists_the_routes(api: httpx.Client) -> None:
    paths = api.get("/openapi.json").json()["paths"]
    for path in ("/sweeps", "/sweeps/{sweep_id}", "/trials/{trial_id}/log", "/devices", "/health"):
        assert path in paths


def test_an_auto_sweep_shows_its_workloads_split_search(
    api: httpx.Client, sessions: Sessions, tmp_path: Path
) -> None:
    auto = api.post("/sweeps", json=sweep_body(tmp_path, "batch_size=32", "lr=1e-3..1e-1:2")).json()
    fixed = api.post("/sweeps", json=sweep_body(tmp_path, "batch_size=32", split=2)).json()
    with sessions.write.begin() as session:
        profile_store.save_profile(
            session=session,
            device_name="NVIDIA H200",
            fingerprint=split_curve.workload_fingerprint(
                [auto["workdir"], *auto["command"]], auto["params"]
            ),
            command=auto["command"],
            param_tokens=["batch_size=32"],
            unit="samples/s",
            curve=[{"split": 1, "throughput": 1000.0}, {"split": 2, "throughput": 1900.0}],
            best_split=None,
            settled=False,
            reason="measuring N=3",
            sweep_id=auto["id"],
        )
    (profile,) = api.get(f"/sweeps/{auto['id']}").json()["profiles"]
    assert profile["device_name"] == "NVIDIA H200" and profile["reason"] == "measuring N=3"
    assert [point["split"] for point in profile["curve"]] == [1, 2]
    assert api.get(f"/sweeps/{fixed['id']}").json()["profiles"] == []
