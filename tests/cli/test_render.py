from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from builders import sweep_public, trial_public
from rich.console import Console, RenderableType

from gpumux.cli import render, top
from gpumux.cli.state import PIPE_WIDTH, make_console
from gpumux.grammar.sweepplan import Objective
from gpumux.schemas.devices import DeviceTrial
from gpumux.schemas.profiles import ProfilePublic
from gpumux.schemas.sweeps import SweepPublic
from gpumux.schemas.trials import TrialPublic
from gpumux.status import ObjectiveMode, SearchMethod, TrialStatus
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


def a_sweep(**fields: Any) -> SweepPublic:
    return sweep_public(**({"counts": {TrialStatus.succeeded: 2}} | fields))


def a_trial(number: int, status: TrialStatus, step: int | None) -> TrialPublic:
    return trial_public(
        id=number,
        number=number,
        params={"lr": 0.001 * number},
        status=status,
        objective=0.5,
        step=step,
    )


def lines_of(renderable: RenderableType) -> list[str]:
    console = Console(record=True, width=160, markup=False, highlight=False)
    console.print(renderable)
    return console.export_text().splitlines()


def test_the_search_line_says_how_many_trials_an_adaptive_search_asked_of_its_budget() -> None:
    def search_line(sweep: SweepPublic) -> str:
        return next(line for line in lines_of(render.sweep_summary(sweep)) if "search" in line)

    assert search_line(a_sweep()).split() == ["search", "grid,", "seed", "11,", "split", "auto"]
    random = a_sweep(search=SearchMethod.random, trials=2)
    assert "random, 2 trials, seed 11" in search_line(random)
    counts = {TrialStatus.succeeded: 3, TrialStatus.pruned: 2, TrialStatus.running: 2}
    tpe = a_sweep(search=SearchMethod.tpe, trials=50, trial_count=50, counts=counts, prune="asha")
    assert "tpe, 7 of 50 asked, seed 11" in search_line(tpe)
    summary = lines_of(render.sweep_summary(tpe))
    assert [line.split() for line in summary if line.startswith("prune")] == [["prune", "asha"]]
    assert "2 running, 3 succeeded, 2 pruned" in " ".join(summary)
    assert not [line for line in lines_of(render.sweep_summary(a_sweep())) if "prune" in line]
    tuned = a_sweep(
        search=SearchMethod.tpe,
        search_options={"n_startup_trials": 4, "multivariate": False},
        trials=12,
        trial_count=12,
        counts={},
    )
    assert "tpe:n_startup_trials=4,multivariate=false, 0 of 12 asked" in search_line(tuned)


def test_the_summary_says_preload_only_of_a_preload_sweep() -> None:
    def preload_lines(sweep: SweepPublic) -> list[list[str]]:
        return [line.split() for line in lines_of(render.sweep_summary(sweep)) if "preload" in line]

    assert preload_lines(a_sweep(preload=True)) == [["preload", "yes"]]
    assert preload_lines(a_sweep()) == []


def test_the_trials_table_shows_the_step_each_trial_reached_once_one_has() -> None:
    trials = [a_trial(1, TrialStatus.pruned, 4), a_trial(2, TrialStatus.succeeded, 20)]
    lines = lines_of(
        render.trials_table(trials, objective=Objective("val_loss", ObjectiveMode.min))
    )
    header = [cell.strip() for cell in lines[1].split("┃")[1:-1]]
    assert header[:4] == ["trial", "lr", "status", "step"]
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines if "│" in line]
    # Counted from 1, as the user counts epochs: the API's step 20 is the 21st.
    assert [row[2:4] for row in rows] == [["pruned", "5"], ["succeeded", "21"]]
    no_steps = lines_of(
        render.trials_table([a_trial(1, TrialStatus.succeeded, None)], objective=None)
    )
    assert "step" not in no_steps[1]
    assert render.status_text(TrialStatus.pruned).style == render.STATUS_STYLES["pruned"]


def test_show_says_which_trials_had_reports_dropped_and_how_many() -> None:
    flooded = trial_public(id=7, reports_dropped=12_345)
    quiet = trial_public(id=8)
    text = " ".join(lines_of(render.dropped_reports([flooded, quiet]) or ""))
    assert "trial 7: 12,345 reports dropped" in text
    assert "trial 8" not in text
    assert render.dropped_reports([quiet]) is None


def test_piped_output_is_not_cut_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert make_console().width == PIPE_WIDTH
    monkeypatch.setenv("COLUMNS", "90")
    assert make_console().width == 90, "an explicit width wins"


def test_another_users_escape_sequences_reach_the_terminal_as_text() -> None:
    sweep = sweep_public(command=["echo", "\x1b]0;owned\x07\x1b[2J"], workdir="/tmp/\x1b[31m")
    trial = trial_public(status=TrialStatus.failed, error="exit 1\n\x1b[2Jcleared\nlast")

    shown = "\n".join(
        lines_of(render.sweep_summary(sweep))
        + [render.error_summary(trial.error)]
        + lines_of(render.failures([trial], total=1) or "")
    )

    assert "\x1b" not in shown and "\x07" not in shown
    assert "echo \\x1b]0;owned\\x07\\x1b[2J" in shown
    assert "/tmp/\\x1b[31m" in shown
    assert "\\x1b[2Jcleared" in shown


def test_top_shows_another_users_command_and_parameters_as_text() -> None:
    sweep = sweep_public(id=3, command=["python", "-c", "\x1b[2J"])
    packed = DeviceTrial(trial_id=7, sweep_id=3, slot=0, memory_limit_mb=None, samples_per_s=None)

    shown = "\n".join(
        lines_of(top.trials_view([packed], sweeps={3: sweep}, params={7: {"tag": "\x1b[31m"}}))
    )

    assert "\x1b" not in shown
    assert "\\x1b[2J" in shown and "tag=\\x1b[31m" in shown
