from __future__ import annotations

from datetime import UTC, datetime

from gpumux.cli import render
from gpumux.schemas import ProfilePoint, ProfilePublic


def profile(*, settled: bool, reason: str | None, curve: list[ProfilePoint]) -> ProfilePublic:
    now = datetime.now(UTC)
    return ProfilePublic(
        id=1,
        device_name="NVIDIA H200",
        fingerprint="abc",
        command=["python", "train.py"],
        param_tokens=[],
        unit="samples/s",
        curve=curve,
        best_split=2 if settled else None,
        settled=settled,
        reason=reason,
        sweep_id=1,
        created_at=now,
        updated_at=now,
    )


def test_the_split_search_line_shows_the_curve_and_the_decision() -> None:
    curve = [
        ProfilePoint(split=1, throughput=1932.4),
        ProfilePoint(split=2, throughput=4034.0),
    ]
    line = render.search_text(profile(settled=False, reason="measuring N=3", curve=curve)).plain
    assert line == (
        "split search on NVIDIA H200: N=1 1,932.4, N=2 4,034.0 samples/s; measuring N=3"
    )
    fresh = render.search_text(profile(settled=False, reason=None, curve=[])).plain
    assert fresh == "split search on NVIDIA H200: measuring N=1"
