"""What a hostile or careless client may send: refused at the door, and nothing stored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from builders import sweep_body

from gpumux.grammar import sweepspec

SURROGATE = "\ud800"


def post_raw(api: httpx.Client, path: str, document: object) -> httpx.Response:
    """POST `document` as JSON text, lone surrogates escaped (\\ud800) as a hostile client may."""
    return api.post(
        path, content=json.dumps(document), headers={"Content-Type": "application/json"}
    )


def assert_nothing_stored(api: httpx.Client) -> None:
    listed = api.get("/sweeps")
    assert listed.status_code == 200, listed.text
    assert listed.json()["count"] == 0


def poisoned(tmp_path: Path, where: str) -> dict[str, Any]:
    fields: dict[str, dict[str, Any]] = {
        "param name": sweep_body(tmp_path, "x=1", f"y={SURROGATE}"),
        "choice": sweep_body(tmp_path, f"y=a,{SURROGATE}"),
        "command": sweep_body(tmp_path, command=["python", f"train{SURROGATE}.py"]),
        "env name": sweep_body(tmp_path, env={f"A{SURROGATE}": "1"}),
        "env value": sweep_body(tmp_path, env={"A": SURROGATE}),
        "workdir": sweep_body(tmp_path, workdir=f"{tmp_path}/{SURROGATE}"),
        "name": sweep_body(tmp_path, name=SURROGATE),
        "objective": sweep_body(tmp_path, objective=f"loss{SURROGATE}:min"),
        "prune": sweep_body(tmp_path, objective="loss:min", prune=f"median{SURROGATE}"),
    }
    return fields[where]


@pytest.mark.parametrize(
    "where",
    [
        "param name",
        "choice",
        "command",
        "env name",
        "env value",
        "workdir",
        "name",
        "objective",
        "prune",
    ],
)
def test_a_lone_surrogate_anywhere_in_a_sweep_is_refused_at_the_door(
    api: httpx.Client, tmp_path: Path, where: str
) -> None:
    response = post_raw(api, "/sweeps", poisoned(tmp_path, where))
    assert response.status_code == 422, response.text
    assert [field["type"] for field in response.json()["errors"]] == ["string_unicode"]
    assert_nothing_stored(api)


@pytest.mark.no_query
def test_a_lone_surrogate_in_a_token_request_is_refused(api: httpx.Client) -> None:
    response = post_raw(api, "/tokens", {"user": f"root{SURROGATE}"})
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["type"] == "string_unicode"


def test_the_poisoned_probe_leaves_listing_showing_and_trials_working(
    api: httpx.Client, tmp_path: Path
) -> None:
    assert post_raw(api, "/sweeps", poisoned(tmp_path, "choice")).status_code == 422
    good = api.post("/sweeps", json=sweep_body(tmp_path, "y=a,b"))
    assert good.status_code == 201, good.text
    sweep_id = good.json()["id"]
    for path in ("/sweeps", f"/sweeps/{sweep_id}", f"/sweeps/{sweep_id}/trials"):
        answer = api.get(path)
        assert answer.status_code == 200, (path, answer.text)


@pytest.mark.no_query
def test_a_report_whose_trial_id_overflows_its_column_is_refused_before_any_token(
    api: httpx.Client,
) -> None:
    report = '{"trial_id": ' + "9" * 100 + ', "attempt": 1, "kind": "manual"}'
    response = api.post(
        "/reports",
        content=report,
        headers={"Content-Type": "application/json", "Authorization": ""},
    )
    assert response.status_code == 422, response.text


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999", "1e30"])
def test_a_time_limit_that_is_no_finite_sane_number_is_refused(
    api: httpx.Client, tmp_path: Path, number: str
) -> None:
    # JSON has no NaN or Infinity, yet Python's parser reads them: written here by hand.
    document = json.dumps(sweep_body(tmp_path, "x=1"))[:-1] + f', "time_limit_s": {number}}}'
    response = api.post("/sweeps", content=document, headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert_nothing_stored(api)


@pytest.mark.parametrize(
    ("fields", "what"),
    [
        ({"env": {"BIG": "x" * 200_000}}, "env value"),
        ({"env": {f"V{i}": "1" for i in range(5_000)}}, "env entries"),
        ({"env": {f"V{i}": "x" * 100_000 for i in range(6)}}, "env total"),
        ({"command": ["python", "x" * 200_000]}, "command word"),
        ({"command": ["python"] + ["x"] * 2_000}, "command words"),
        ({"command": ["python"] + ["x" * 100_000] * 3}, "command total"),
        ({"workdir": "/" + "d" * 5_000}, "workdir"),
        ({"name": "n" * 201}, "name"),
    ],
)
def test_sizes_over_their_limits_are_refused_and_nothing_is_stored(
    api: httpx.Client, tmp_path: Path, fields: dict[str, Any], what: str
) -> None:
    response = api.post("/sweeps", json=sweep_body(tmp_path, "x=1", **fields))
    assert response.status_code == 422, (what, response.text[:300])
    assert_nothing_stored(api)


def test_a_grid_of_astronomic_size_is_refused_unexpanded_with_a_short_message(
    api: httpx.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expanded: list[str] = []
    grid_values = sweepspec.Param.grid_values

    def counted(param: sweepspec.Param) -> tuple[sweepspec.Value, ...]:
        expanded.append(param.name)
        return grid_values(param)

    # The daemon runs in this process: a parameter's points computed are counted here.
    monkeypatch.setattr(sweepspec.Param, "grid_values", counted)
    params = [f"p{i}=1..2:{sweepspec.MAX_POINTS}" for i in range(sweepspec.MAX_PARAMS)]
    response = api.post("/sweeps", json=sweep_body(tmp_path, *params))
    assert response.status_code == 422, response.text[:300]
    assert len(response.json()["detail"]) < 300
    assert expanded == []
    assert_nothing_stored(api)


def test_a_grid_whose_size_has_thousands_of_digits_is_refused_not_an_error(
    api: httpx.Client, tmp_path: Path
) -> None:
    end = sweepspec.MAX_INT_END
    params = [f"p{i}=0..{end}" for i in range(300)]
    response = api.post("/sweeps", json=sweep_body(tmp_path, *params))
    assert response.status_code == 422, response.text[:300]
    assert_nothing_stored(api)


def test_more_parameters_than_the_limit_are_refused(api: httpx.Client, tmp_path: Path) -> None:
    params = [f"p{i}=1" for i in range(sweepspec.MAX_PARAMS + 1)]
    response = api.post("/sweeps", json=sweep_body(tmp_path, *params))
    assert response.status_code == 422, response.text[:300]
    assert_nothing_stored(api)


def test_a_placeholder_that_names_no_parameter_is_refused_naming_it(
    api: httpx.Client, tmp_path: Path
) -> None:
    response = api.post(
        "/sweeps", json=sweep_body(tmp_path, "lr=0.1", command=["python", "train.py", "--x={lrr}"])
    )
    assert response.status_code == 422, response.text
    detail = response.text
    assert "{lrr}" in detail and "lr" in detail and "{{" in detail
    assert_nothing_stored(api)


def test_placeholders_of_parameters_and_escaped_braces_are_accepted(
    api: httpx.Client, tmp_path: Path
) -> None:
    command = ["bash", "-c", "echo {lr} ${{HOME}}"]
    response = api.post("/sweeps", json=sweep_body(tmp_path, "lr=0.1", command=command))
    assert response.status_code == 201, response.text


@pytest.mark.no_query
@pytest.mark.parametrize(
    "report",
    [
        {"samples": 1e308, "seconds": 1e-300},
        {"samples": 10.0, "seconds": 1e300},
        {"samples": 10**400, "seconds": 1.0},
        {"attempt": 2**63},
        {"metrics": {"m" * 300: 1.0}},
        {"metrics": {f"m{i}": 1.0 for i in range(10_000)}},
    ],
)
def test_a_report_with_impossible_values_is_refused(
    api: httpx.Client, report: dict[str, Any]
) -> None:
    document = {"trial_id": 1, "attempt": 1, "kind": "manual", **report}
    response = api.post("/reports", json=document, headers={"Authorization": "Bearer nope"})
    assert response.status_code == 422, response.text[:300]
