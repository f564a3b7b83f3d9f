from __future__ import annotations

from typing import Any

import httpx

from gpumux.storage import profiles as profile_store
from gpumux.storage.engine import Sessions

CURVE: list[dict[str, Any]] = [
    {"split": 1, "throughput": 2.5, "seconds_per_trial": 40.0, "memory_per_trial_mb": 512.0},
    {"split": 3, "throughput": 6.0, "seconds_per_trial": 50.0, "memory_per_trial_mb": None},
]


def save_profiles(sessions: Sessions, count: int) -> list[int]:
    """`count` profiles of one workload on as many device models, the last saved last."""
    with sessions.write.begin() as session:
        return [
            profile_store.save_profile(
                session=session,
                device_name=f"device {n}",
                fingerprint="a" * 64,
                command=["python", "train.py"],
                param_tokens=["bs=64"],
                unit="trials/s",
                curve=CURVE,
                best_split=3,
                settled=n % 2 == 0,
                reason="knee at N=3",
                sweep_id=None,
            ).id
            for n in range(count)
        ]


def test_a_profile_has_its_curve_as_points(api: httpx.Client, sessions: Sessions) -> None:
    (profile_id,) = save_profiles(sessions, 1)
    response = api.get(f"/profiles/{profile_id}")
    assert response.status_code == 200, response.text
    profile: dict[str, Any] = response.json()
    # How sure each point is, and its steady reading: unknown for points stored without them.
    unknown = {"trials": None, "spread": None, "rate": None, "startup_s": None}
    assert profile["curve"] == [{**point, **unknown} for point in CURVE]
    assert profile["device_name"] == "device 0" and profile["fingerprint"] == "a" * 64
    assert profile["command"] == ["python", "train.py"] and profile["param_tokens"] == ["bs=64"]
    assert profile["unit"] == "trials/s" and profile["best_split"] == 3
    assert profile["settled"] is True and profile["reason"] == "knee at N=3"
    assert profile["sweep_id"] is None and profile["updated_at"] == profile["created_at"]


def test_an_unknown_profile_is_404(api: httpx.Client) -> None:
    response = api.get("/profiles/41")
    assert response.status_code == 404
    assert response.json()["detail"] == "profile 41 not found"


def test_profiles_page_the_most_recently_updated_first(
    api: httpx.Client, sessions: Sessions
) -> None:
    assert api.get("/profiles").json() == {"data": [], "count": 0}
    ids = save_profiles(sessions, 5)
    page = api.get("/profiles", params={"offset": 1, "limit": 2}).json()
    assert page["count"] == 5
    assert [profile["id"] for profile in page["data"]] == [ids[3], ids[2]]
    assert api.get("/profiles", params={"limit": 0}).status_code == 422


def test_a_measured_curve_is_refused_for_a_device_the_daemon_lacks_or_a_best_n_not_measured(
    api: httpx.Client,
) -> None:
    measured = {
        "device": "GPU-0", "device_name": "NVIDIA H200", "workdir": "/work",
        "command": ["python", "train.py"], "unit": "trials/s", "curve": CURVE, "best_split": 3,
        "reason": "gpumux tune: N=3 of 1, 3",
    }  # fmt: skip
    response = api.put("/profiles", json=measured)
    assert response.status_code == 422, response.text
    assert "device GPU-0 (NVIDIA H200) is not one of this daemon's" in response.text
    response = api.put("/profiles", json={**measured, "best_split": 2})
    assert response.status_code == 422, response.text
    assert "best_split 2 is no N of the curve" in response.text
    # A point that is no JSON object (schemathesis's coverage phase sent [[null, null]]: a 500).
    response = api.put("/profiles", json={**measured, "curve": [[None, None]]})
    assert response.status_code == 422, response.text
    assert "a curve point must be an object, not list" in response.text
    assert api.get("/profiles").json() == {"data": [], "count": 0}
