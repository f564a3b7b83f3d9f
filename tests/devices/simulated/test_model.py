"""The simulated GPU's contention model: its maths, its files, and the refusal of a bad one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpumux.config import Settings
from gpumux.devices.simulated.model import DeviceModel, ModelError, model_from, parse_model
from gpumux.devices.simulated.state import load_model, shipped_models


def model(**fields: Any) -> DeviceModel:
    data: dict[str, Any] = {
        "name": "Test GPU",
        "memory_mb": 10_000,
        "cores": 4,
        "per_process_mb": 1_000,
        "startup_s": 2.0,
        "throughput": {"1": 100, "3": 240, "5": 200},
    }
    return model_from({**data, **fields}, source="test.json")


def test_aggregate_is_given_at_the_given_n_linear_between_and_flat_beyond() -> None:
    m = model()
    assert m.aggregate(1) == 100
    assert m.aggregate(3) == 240
    assert m.aggregate(2) == pytest.approx(170)
    assert m.aggregate(4) == pytest.approx(220)
    assert m.aggregate(5) == m.aggregate(50) == 200


def test_one_trial_computes_its_share_of_the_aggregate() -> None:
    m = model()
    assert m.per_trial(1) == 100
    assert m.per_trial(3) == pytest.approx(80)
    assert m.per_trial(4) == pytest.approx(55)


def test_no_throughput_below_one_trial() -> None:
    with pytest.raises(ValueError, match="N starts at 1"):
        model().aggregate(0)


def test_start_up_is_crowded_only_beyond_the_cores() -> None:
    m = model(cores=4, startup_s=2.0)
    assert m.startup_share(1) == m.startup_share(4) == 1.0
    assert m.startup_share(8) == 0.5
    assert m.startup_seconds(4) == 2.0
    assert m.startup_seconds(6) == pytest.approx(3.0)


def test_the_slice_holds_what_is_not_context() -> None:
    assert model(per_process_mb=956, context_mb=728).slice_mb == 228
    assert model(per_process_mb=956).slice_mb == 956


def test_the_best_split_is_the_highest_rate_the_smallest_on_a_tie() -> None:
    assert model().best_split == 3
    assert model(throughput={"1": 1, "2": 5, "4": 5}).best_split == 2


def test_a_model_survives_its_own_json() -> None:
    m = model(context_mb=100, epoch_samples=7, about="measured")
    assert parse_model(json.dumps(m.as_json()), source="again") == m


def test_the_epoch_defaults_to_a_second_of_one_trial() -> None:
    assert model().epoch_samples == 100


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"name": "x"}', "missing memory_mb, cores, per_process_mb, startup_s, throughput"),
    ],
)
def test_a_file_that_is_no_model_is_refused(text: str, says: str) -> None:
    with pytest.raises(ModelError, match=f"^bad.json: .*{says}"):
        parse_model(text, source="bad.json")


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"throughput_by_n": {}}, "unknown key throughput_by_n"),
        ({"name": ""}, "name must be the GPU's name"),
        ({"memory_mb": "80GB"}, "memory_mb must be a whole number"),
        ({"cores": 0}, "cores must be a whole number of at least 1"),
        ({"cores": True}, "cores must be a whole number"),
        ({"context_mb": 2000}, "context_mb .* cannot exceed it"),
        ({"per_process_mb": 20_000}, "exceeds the GPU's memory_mb"),
        ({"startup_s": -1}, "startup_s must be a number of seconds"),
        ({"startup_s": "10"}, "startup_s must be a number of seconds"),
        ({"throughput": [100, 200]}, "throughput must map N"),
        ({"throughput": {}}, "throughput must map N"),
        ({"throughput": {"2": 100}}, "N=1 .* is required"),
        ({"throughput": {"1": 100, "two": 150}}, "'two' is not an N"),
        ({"throughput": {"1": 100, "0": 150}}, "'0' is not an N"),
        ({"throughput": {"1": 0}}, "at N=1: 0 is not a rate above 0"),
        ({"throughput": {"1": 100, "01": 150}}, "an N is given twice"),
        ({"about": 3}, "about must be a text"),
        ({"epoch_samples": 0}, "epoch_samples must be a whole number"),
    ],
)
def test_a_malformed_key_is_refused_by_name(fields: dict[str, Any], says: str) -> None:
    with pytest.raises(ModelError, match=f"^test.json: .*{says}"):
        model(**fields)


def test_every_shipped_model_loads() -> None:
    assert {"h200-torch-mlp", "h100-memory-bound", "a100-compute-bound"} <= set(shipped_models())
    for name in shipped_models():
        assert load_model(name).name


def test_the_memory_bound_shape_fits_eight_slices_and_would_compute_more() -> None:
    m = load_model("h100-memory-bound")
    rules = Settings()

    def slice_at(n: int) -> int:
        return (m.memory_mb - rules.reserve_mb) // n - rules.overhead_mb

    assert slice_at(8) >= m.slice_mb > slice_at(9)
    assert m.aggregate(16) > 1.05 * m.aggregate(8)


def test_the_compute_bound_shape_is_best_at_two_or_three() -> None:
    assert load_model("a100-compute-bound").best_split in {2, 3}


def test_a_missing_model_file_names_the_shipped_ones(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no such model file, nor a shipped model .*h200"):
        load_model(tmp_path / "none.json")


def test_the_setting_refuses_a_malformed_model_with_its_reason(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**model().as_json(), "throughput": {"2": 10}}))
    with pytest.raises(ValueError, match=r"simulated_gpu: .*bad\.json: .*N=1 .* is required"):
        Settings(home=tmp_path, simulated_gpu=str(bad))
    assert Settings(home=tmp_path, simulated_gpu="h200-torch-mlp").simulated_gpu
