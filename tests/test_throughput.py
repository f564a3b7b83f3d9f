"""The one curve-point type: checked where it is read or stored, the same through a stored
profile and the API's JSON."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gpumux.schemas.profiles import ProfilePublic
from gpumux.storage import profiles as profile_store
from gpumux.storage.engine import Sessions
from gpumux.throughput import THROUGHPUT_UNITS, CurvePoint, throughput_unit

POINTS = [
    CurvePoint(split=1, throughput=120, seconds_per_trial=10.5, memory_per_trial_mb=900),
    CurvePoint(split=2, throughput=230.5, seconds_per_trial=None, memory_per_trial_mb=None),
    CurvePoint(split=3, throughput=0.0),
]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"split": 1, "throughput": 1.0, "memory_mb": 3}, "no field memory_mb"),
        ({"split": 1}, "needs a split and a throughput"),
        ({"split": 0, "throughput": 1.0}, "split must be an integer of 1 or more: 0"),
        ({"split": 2.0, "throughput": 1.0}, "split must be an integer of 1 or more: 2.0"),
        ({"split": True, "throughput": 1.0}, "split must be an integer of 1 or more: True"),
        ({"split": 1, "throughput": float("inf")}, "throughput must be a finite number"),
        ({"split": 1, "throughput": "fast"}, "throughput must be a finite number: 'fast'"),
        ({"split": 1, "throughput": -1}, "throughput must be 0 or more: -1"),
        ({"split": 1, "throughput": 1, "seconds_per_trial": 0}, "seconds_per_trial must be above"),
        ({"split": 1, "throughput": 1, "memory_per_trial_mb": -5}, "memory_per_trial_mb must be 0"),
        ({"split": 1, "throughput": 1, "rate": 0}, "rate must be above 0"),
        ({"split": 1, "throughput": 1, "startup_s": -1.0}, "startup_s must be 0 or more"),
        ({"split": 1, "throughput": 1, "startup_s": float("nan")}, "startup_s must be a finite"),
        ([None, None], "a curve point must be an object, not list"),
        ("split", "a curve point must be an object, not str"),
        (3, "a curve point must be an object, not int"),
    ],
)
def test_a_bad_point_is_refused_naming_what_is_wrong(data: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CurvePoint.from_json(data)


def test_json_numbers_are_floats_but_for_the_split() -> None:
    assert POINTS[0].to_json() == {
        "split": 1,
        "throughput": 120.0,
        "seconds_per_trial": 10.5,
        "memory_per_trial_mb": 900.0,
    }
    assert all(isinstance(v, float) for k, v in POINTS[0].to_json().items() if k != "split")
    assert [CurvePoint.from_json(point.to_json()) for point in POINTS] == POINTS


def test_a_point_says_how_sure_it_is_where_measured() -> None:
    sure = CurvePoint(split=4, throughput=400.0, trials=4, spread=0.1)

    assert sure.to_json() == {
        "split": 4,
        "throughput": 400.0,
        "seconds_per_trial": None,
        "memory_per_trial_mb": None,
        "trials": 4,
        "spread": 0.1,
    }
    assert CurvePoint.from_json(sure.to_json()) == sure
    with pytest.raises(ValueError, match="trials must be 1 or more"):
        CurvePoint.from_json({"split": 1, "throughput": 1.0, "trials": 0})
    with pytest.raises(ValueError, match="spread must be a finite number"):
        CurvePoint.from_json({"split": 1, "throughput": 1.0, "spread": "wide"})


def test_a_point_with_its_steady_rate_and_start_up_stores_them() -> None:
    steady = CurvePoint(split=2, throughput=10.0, rate=8.0, startup_s=3.0)

    assert steady.to_json() | {"rate": 8.0, "startup_s": 3.0} == steady.to_json()
    assert CurvePoint.from_json(steady.to_json()) == steady
    assert "rate" not in POINTS[0].to_json(), "a point measured without them reads as before"


@pytest.mark.parametrize(
    ("point", "work", "throughput"),
    [
        # N trials, each 3 s starting and then 80 / 8 s computing.
        (CurvePoint(split=2, throughput=10.0, rate=8.0, startup_s=3.0), 80.0, 2 * 80 / 13),
        # More work weighs the start-up less: towards N times the steady rate.
        (CurvePoint(split=2, throughput=10.0, rate=8.0, startup_s=3.0), 8e6, 2 * 8e6 / (3 + 1e6)),
        # No start-up: N times the steady rate, whatever the work.
        (CurvePoint(split=3, throughput=10.0, rate=5.0, startup_s=0.0), 7.0, 15.0),
        # Unknown work, rate or start-up: as measured.
        (CurvePoint(split=2, throughput=10.0, rate=8.0, startup_s=3.0), None, 10.0),
        (CurvePoint(split=2, throughput=10.0, rate=8.0, startup_s=3.0), 0.0, 10.0),
        (CurvePoint(split=2, throughput=10.0, startup_s=3.0), 80.0, 10.0),
        (CurvePoint(split=2, throughput=10.0, rate=8.0), 80.0, 10.0),
        # A work too large for a float's arithmetic: as measured, never infinite or NaN.
        (CurvePoint(split=2, throughput=10.0, rate=1e-300, startup_s=3.0), 1e308, 10.0),
    ],
)
def test_a_point_read_at_a_trials_work_counts_its_start_up_once_a_trial(
    point: CurvePoint, work: float | None, throughput: float
) -> None:
    read = point.at_work(work)

    assert read.throughput == pytest.approx(throughput)
    assert read.split == point.split and (read.rate, read.startup_s) == (
        point.rate,
        point.startup_s,
    )


def test_units_are_named_or_refused() -> None:
    assert [throughput_unit(unit) for unit in THROUGHPUT_UNITS] == [
        "samples/s",
        "steps/s",
        "trials/s",
    ]
    with pytest.raises(ValueError, match="'epochs/s' is not one of samples/s, steps/s, trials/s"):
        throughput_unit("epochs/s")


def test_points_round_trip_through_a_stored_profile_and_the_api(sessions: Sessions) -> None:
    with sessions.write.begin() as session:
        profile_store.save_profile(
            session=session,
            device_name="NVIDIA H200",
            fingerprint="c" * 16,
            command=["python", "train.py"],
            param_tokens=[],
            unit="samples/s",
            curve=[point.to_json() for point in POINTS],
            best_split=2,
            settled=True,
            reason="knee",
            sweep_id=None,
        )
    with sessions.read() as session:
        (profile,), _ = profile_store.list_profiles(session=session)
        assert [CurvePoint.from_json(point) for point in profile.curve] == POINTS
        public = ProfilePublic.model_validate(profile)
    assert public.curve == POINTS and public.unit == "samples/s"
    served = ProfilePublic.model_validate_json(public.model_dump_json())
    assert served.curve == POINTS
    assert all(isinstance(point, CurvePoint) for point in served.curve)


@pytest.mark.parametrize(
    "point",
    [
        {"split": 0, "throughput": 1.0},
        {"split": 1, "throughput": float("nan")},
        {"split": 1, "throughput": 1.0, "seconds_per_trial": -2.0},
        {"split": 1, "throughput": 1.0, "flops": 3},
    ],
)
def test_the_api_shape_refuses_a_point_that_storage_would(point: dict[str, Any]) -> None:
    """What a client reads back is held to the checks of what the daemon stores."""
    profile = {
        "id": 1,
        "device_name": "NVIDIA H200",
        "fingerprint": "c" * 16,
        "command": ["python", "train.py"],
        "param_tokens": [],
        "unit": "samples/s",
        "curve": [point],
        "best_split": None,
        "settled": False,
        "reason": None,
        "sweep_id": None,
        "created_at": "2026-11-24T00:00:00Z",
        "updated_at": "2026-11-24T00:00:00Z",
    }
    with pytest.raises(ValidationError, match="a curve point"):
        ProfilePublic.model_validate(profile)
