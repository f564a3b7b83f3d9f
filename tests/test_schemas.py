"""The API's models refuse what cannot be stored and read back, and their schema says so."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from pydantic import ValidationError

from gpumux.fields import (
    ABSOLUTE_PATH,
    ENV_NAME,
    MAX_ARG_BYTES,
    MAX_COMMAND_WORDS,
    MAX_COUNT,
    MAX_ENV_ENTRIES,
    MAX_ID,
    MAX_METRICS,
    MAX_NAME_CHARS,
    MAX_REPORT_SECONDS,
    MAX_SAMPLES,
    MAX_TIME_LIMIT_S,
    NUL_FREE,
    PARAM_TOKEN,
    PATH_MAX,
    PRINTABLE,
)
from gpumux.grammar import sweepspec
from gpumux.grammar.sweepplan import parse_objective
from gpumux.schemas.reports import ReportIn
from gpumux.schemas.sweeps import SweepCreate
from gpumux.schemas.tokens import TokenCreate
from gpumux.text import QUOTE_CHARS, quoted

SURROGATE = "\ud800"


def sweep(**fields: Any) -> dict[str, Any]:
    return {"params": ["x=1"], "command": ["python", "train.py"], "workdir": "/tmp", **fields}


@pytest.mark.parametrize(
    "fields",
    [
        {"params": [f"x={SURROGATE}"]},
        {"params": [f"x=a,{SURROGATE}"]},
        {"command": ["python", SURROGATE]},
        {"env": {SURROGATE: "1"}},
        {"env": {"A": SURROGATE}},
        {"workdir": f"/tmp/{SURROGATE}"},
        {"name": SURROGATE},
        {"objective": f"{SURROGATE}:min"},
        {"prune": f"median:{SURROGATE}"},
    ],
)
def test_a_lone_surrogate_in_any_string_of_a_sweep_is_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as refused:
        SweepCreate.model_validate(sweep(**fields))
    assert refused.value.errors()[0]["type"] == "string_unicode"


def test_a_lone_surrogate_in_a_token_request_or_a_metric_name_is_refused() -> None:
    with pytest.raises(ValidationError):
        TokenCreate.model_validate({"user": f"root{SURROGATE}"})
    with pytest.raises(ValidationError):
        ReportIn.model_validate(
            {"trial_id": 1, "attempt": 1, "kind": "manual", "metrics": {SURROGATE: 1.0}}
        )


@pytest.mark.parametrize(
    "fields",
    [
        {"time_limit_s": math.nan},
        {"time_limit_s": math.inf},
        {"time_limit_s": MAX_TIME_LIMIT_S * 2},
        {"trials": 2**63},
        {"seed": 2**64},
        {"env": {"A": "x\0y"}},
        {"workdir": "/" + "d" * PATH_MAX},
    ],
)
def test_values_no_column_or_process_can_hold_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        SweepCreate.model_validate(sweep(**fields))


@pytest.mark.parametrize(
    "fields",
    [
        {"trial_id": 10**100},
        {"trial_id": 0},
        {"attempt": 2**31},
        {"samples": math.inf},
        {"samples": MAX_SAMPLES * 10},
        {"seconds": math.nan},
        {"seconds": MAX_REPORT_SECONDS * 10},
        {"metrics": {f"m{i}": 1.0 for i in range(MAX_METRICS + 1)}},
        {"metrics": {"m" * (MAX_NAME_CHARS + 1): 1.0}},
        {"metrics": {"val\0loss": 1.0}},
    ],
)
def test_reports_with_impossible_values_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ReportIn.model_validate({"trial_id": 1, "attempt": 1, "kind": "manual", **fields})


def test_a_report_at_the_limits_is_accepted() -> None:
    report = ReportIn.model_validate(
        {
            "trial_id": MAX_ID,
            "attempt": MAX_COUNT,
            "kind": "manual",
            "samples": MAX_SAMPLES,
            "seconds": MAX_REPORT_SECONDS,
            "metrics": {f"m{i}": 1.0 for i in range(MAX_METRICS - 1)} | {"bad": math.inf},
        }
    )
    assert len(report.metrics) == MAX_METRICS - 1 and "bad" not in report.metrics


def test_the_schema_states_the_bounds() -> None:
    schema = SweepCreate.model_json_schema()
    fields = schema["properties"]
    assert fields["params"]["maxItems"] == sweepspec.MAX_PARAMS
    assert fields["params"]["items"]["maxLength"] == sweepspec.MAX_TOKEN_CHARS
    assert fields["params"]["items"]["pattern"] == PARAM_TOKEN
    assert fields["command"]["maxItems"] == MAX_COMMAND_WORDS
    assert fields["command"]["items"]["pattern"] == NUL_FREE
    assert fields["workdir"]["maxLength"] == PATH_MAX - 1
    assert fields["workdir"]["pattern"] == ABSOLUTE_PATH
    assert fields["env"]["maxProperties"] == MAX_ENV_ENTRIES
    assert fields["env"]["propertyNames"]["pattern"] == ENV_NAME
    limit = next(s for s in fields["time_limit_s"]["anyOf"] if s.get("type") == "number")
    assert limit["maximum"] == MAX_TIME_LIMIT_S
    report = ReportIn.model_json_schema()["properties"]
    assert report["trial_id"]["maximum"] == MAX_ID
    assert report["metrics"]["maxProperties"] == MAX_METRICS


def test_the_schema_patterns_agree_with_the_validators() -> None:
    assert re.fullmatch(PARAM_TOKEN, "lr=1e-3..1e-1")
    assert not re.fullmatch(PARAM_TOKEN, "--lr=1")
    assert not re.fullmatch(NUL_FREE, "a\0b")
    assert not re.fullmatch(ABSOLUTE_PATH, "relative")
    assert not re.fullmatch(ENV_NAME, "A=B")


def test_the_largest_grid_the_limits_allow_is_counted_not_expanded() -> None:
    # Every parameter as long as the total allows, each a choice of the most values allowed.
    per_token = sweepspec.MAX_PARAMS_CHARS // sweepspec.MAX_PARAMS
    values = ",".join(str(i) for i in range(sweepspec.MAX_CHOICES))[: per_token - 6]
    params = [f"p{i:03}={values.rstrip(',')}" for i in range(sweepspec.MAX_PARAMS)]
    assert sum(map(len, params)) <= sweepspec.MAX_PARAMS_CHARS
    document = sweep(params=params)
    created = SweepCreate.model_validate(document)
    # Far more points than any memory holds: counted by arithmetic (its cost is measured by
    # benchmarks/refusal_cost.py).
    assert sweepspec.grid_size(sweepspec.parse_params(created.params)) > 10**100


@pytest.mark.parametrize(
    ("field", "value", "accepted"),
    [
        ("step", 3.0, 3),
        ("step", True, None),
        ("step", "3", None),
        ("trial_id", False, None),
        ("samples", "10", None),
        ("seconds", True, None),
    ],
)
def test_report_numbers_are_taken_as_json_schema_counts_them(
    field: str, value: object, accepted: object
) -> None:
    report = {"trial_id": 1, "attempt": 1, "kind": "manual", field: value}
    if accepted is None:
        with pytest.raises(ValidationError):
            ReportIn.model_validate(report)
    else:
        assert getattr(ReportIn.model_validate(report), field) == accepted


@pytest.mark.parametrize(
    ("field", "value", "accepted"),
    [
        ("split", 2.0, 2),
        ("split", "auto", "auto"),
        ("split", "2", None),
        ("trials", True, None),
        ("priority", "1", None),
        ("time_limit_s", "60", None),
        ("time_limit_s", 60, 60.0),
    ],
)
def test_sweep_numbers_are_taken_as_json_schema_counts_them(
    field: str, value: object, accepted: object
) -> None:
    document = sweep(**{field: value})
    if accepted is None:
        with pytest.raises(ValidationError):
            SweepCreate.model_validate(document)
    else:
        assert getattr(SweepCreate.model_validate(document), field) == accepted


def test_a_metric_that_is_not_a_number_is_refused() -> None:
    with pytest.raises(ValidationError, match="valid number"):
        ReportIn.model_validate(
            {"trial_id": 1, "attempt": 1, "kind": "manual", "metrics": {"loss": "0.5"}}
        )


@pytest.mark.parametrize(
    "fields",
    [
        {"objective": "x" * MAX_NAME_CHARS + ":avg"},
        {"env": {"A" * 1000 + "=": "1"}},
        {"env": {"B" * 1000: "v" * MAX_ARG_BYTES}},
        {"split": 10**100},
    ],
)
def test_a_refusal_quotes_at_most_a_cut_of_what_was_sent(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as refused:
        SweepCreate.model_validate(sweep(**fields))
    (error,) = refused.value.errors()
    assert len(error["msg"]) < 200, error["msg"]
    assert not re.search(rf"(.)\1{{{QUOTE_CHARS}}}", error["msg"]), error["msg"]


def test_a_long_objective_is_quoted_cut() -> None:
    with pytest.raises(ValueError) as refused:
        parse_objective("y" * 16_000)
    assert f"'{'y' * QUOTE_CHARS}…'" in str(refused.value) and len(str(refused.value)) < 200


def test_quoted_cuts_only_what_is_too_long() -> None:
    assert quoted("a\nb") == repr("a\nb")
    assert quoted("z" * QUOTE_CHARS) == repr("z" * QUOTE_CHARS)
    assert quoted("z" * (QUOTE_CHARS + 1)) == repr("z" * QUOTE_CHARS + "…")


def test_the_keys_of_a_mapping_are_checked_by_the_schema_as_by_the_validators() -> None:
    # patternProperties would leave a key outside its pattern (a NUL in it) with any value.
    for model in (SweepCreate, ReportIn):
        assert "patternProperties" not in str(model.model_json_schema())
    metrics = ReportIn.model_json_schema()["properties"]["metrics"]
    assert metrics["additionalProperties"] == {"type": "number"}
    assert not re.fullmatch(metrics["propertyNames"]["pattern"], "val\0loss")
    env = SweepCreate.model_json_schema()["properties"]["env"]
    assert not re.fullmatch(env["propertyNames"]["pattern"], "A=B")


@pytest.mark.parametrize(
    "fields",
    [
        {"name": "run \x1b[31mred"},
        {"name": "two\nlines"},
        {"params": ["x=a,\x1b[2J"]},
        {"objective": "val\x1b_loss:min"},
        {"prune": "median\x9b"},
    ],
)
def test_text_shown_in_terminals_holds_no_control_character(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as refused:
        SweepCreate.model_validate(sweep(**fields))
    assert [error["type"] for error in refused.value.errors()] == ["string_control"]


def test_the_printable_pattern_refuses_what_the_validator_refuses() -> None:
    for control in ("\x1b", "\n", "\t", "\x7f", "\x9b"):
        assert not re.fullmatch(PRINTABLE, f"a{control}b")
    assert re.fullmatch(PRINTABLE, "val_loss é 1e-3")
