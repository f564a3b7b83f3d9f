from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpumux.cli import render
from gpumux.cli.state import PIPE_WIDTH, make_console
from gpumux.schemas import ProfilePublic
from gpumux.throughput import CurvePoint


def profile(*, settled: bool, reason: str | None, curve: list[CurvePoint]) -> ProfilePublic:
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
        CurvePoint(split=1, throughput=1932.4),
        CurvePoint(split=2, throughput=4034.0),
    ]
    line = render.search_text(profile(settled=False, reason="measuring N=3", curve=curve)).plain
    assert line == (
        "split search on NVIDIA H200: N=1 1,932.4, N=2 4,034.0 samples/s; measuring N=3"
    )
    fresh = render.search_text(profile(settled=False, reason=None, curve=[])).plain
    assert fresh == "split search on NVIDIA H200: measuring N=1"


def test_piped_output_is_not_cut_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert make_console().width == PIPE_WIDTH
    monkeypatch.setenv("COLUMNS", "90")
    assert make_console().width == 90, "an explicit width wins"
