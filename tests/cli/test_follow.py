"""Following a sweep, without a daemon: the ETA, the best trial so far, the views and lines."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rich.console import Console, RenderableType

from gpumux.cli import follow, render
from gpumux.grammar.sweepplan import parse_objective
from gpumux.schemas.sweeps import SweepDetail
from gpumux.schemas.trials import TrialPublic
from gpumux.status import PruneNote, SearchMethod, SweepStatus, TrialStatus

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def trial(
    number: int,
    status: TrialStatus,
    *,
    started: float | None = None,
    ended: float | None = None,
    objective: float | None = None,
    **fields: Any,
) -> TrialPublic:
    """Trial `number` of sweep 1 (id 100 + number), started and ended `started`/`ended` s in."""
    values: dict[str, Any] = dict(
        id=100 + number,
        sweep_id=1,
        number=number,
        params={"lr": round(0.001 * number, 6), "bs": 32},
        status=status,
        attempt=1,
        failures=0,
        device="cpu" if started is not None else None,
        slot=number % 2 if started is not None else None,
        split=2,
        memory_limit_mb=None,
        cpu_threads=1,
        pid=None,
        queued_at=T0,
        started_at=None if started is None else at(started),
        ended_at=None if ended is None else at(ended),
        exit_code=None,
        signal=None,
        error=None,
        objective=objective,
        samples_per_s=None,
        last_report_at=None,
    )
    values.update(fields)
    return TrialPublic.model_validate(values)


def sweep(
    trials: Iterable[TrialPublic],
    *,
    total: int | None = None,
    objective: str | None = "loss:min",
    best: TrialPublic | None = None,
    status: SweepStatus = SweepStatus.running,
    budget: int | None = None,
) -> SweepDetail:
    """Sweep 1, submitted at T0, counting `trials` and queued ones up to `total`; with a
    `budget`, an adaptive (tpe) sweep of which only `trials` have been asked."""
    trials = list(trials)
    counts: dict[TrialStatus, int] = {}
    for one in trials:
        counts[one.status] = counts.get(one.status, 0) + 1
    total = len(trials) if total is None else total
    if total > len(trials):
        counts[TrialStatus.queued] = counts.get(TrialStatus.queued, 0) + total - len(trials)
    return SweepDetail(
        search=SearchMethod.tpe if budget else SearchMethod.grid,
        id=1,
        name=None,
        owner="ada",
        status=status,
        command=["python", "train.py"],
        params=["lr=1e-3..1e-2", "bs=32"],
        workdir="/tmp",
        trials=None,
        seed=0,
        split=2,
        metric=parse_objective(objective).metric if objective else None,
        mode=parse_objective(objective).mode if objective else None,
        time_limit_s=None,
        retries=0,
        priority=0,
        trial_count=budget or total,
        cancel_requested=False,
        created_at=T0,
        finished_at=None,
        counts=counts,
        best=best,
    )


def text_of(renderable: RenderableType) -> str:
    console = Console(record=True, width=120, markup=False, highlight=False)
    console.print(renderable)
    return console.export_text()


def test_no_eta_until_a_trial_has_ended() -> None:
    trials = [trial(1, TrialStatus.running, started=0), trial(2, TrialStatus.queued)]
    assert follow.eta_seconds(sweep(trials), trials, at(500)) is None
    assert "ETA —" in text_of(follow.progress_view(sweep(trials), trials, at(500)))


def test_eta_counts_the_work_left_in_running_trials() -> None:
    # Two slots, trials of 100 s: two ended at 100 s, two started then and are 30 s in, two wait.
    trials = [
        trial(1, TrialStatus.succeeded, started=0, ended=100),
        trial(2, TrialStatus.succeeded, started=0, ended=100),
        trial(3, TrialStatus.running, started=100),
        trial(4, TrialStatus.running, started=100),
        trial(5, TrialStatus.queued),
        trial(6, TrialStatus.queued),
    ]
    # 70 s left in each running trial, then 100 s for the last two: 170 s.
    assert follow.eta_seconds(sweep(trials), trials, at(130)) == pytest.approx(170)


def test_eta_is_at_least_the_longest_running_trial_left() -> None:
    # One slot's trial has 90 s to go; the other slot is free: averaging would say 45 s.
    trials = [
        trial(1, TrialStatus.succeeded, started=0, ended=100),
        trial(2, TrialStatus.running, started=100),
        trial(3, TrialStatus.running, started=190),
    ]
    assert follow.eta_seconds(sweep(trials), trials, at(200)) == pytest.approx(90)


def test_eta_follows_the_split_as_it_grows() -> None:
    # Twelve trials of 60 s, two ended: the ten left take 300 s on two slots, 150 s on four.
    ended = [trial(n, TrialStatus.succeeded, started=0, ended=60) for n in (1, 2)]
    at_two = [*ended, *(trial(n, TrialStatus.running, started=60) for n in (3, 4))]
    at_two += [trial(n, TrialStatus.queued) for n in range(5, 13)]
    at_four = [*ended, *(trial(n, TrialStatus.running, started=60) for n in range(3, 7))]
    at_four += [trial(n, TrialStatus.queued) for n in range(7, 13)]
    assert follow.eta_seconds(sweep(at_two), at_two, at(60)) == pytest.approx(300)
    assert follow.eta_seconds(sweep(at_four), at_four, at(60)) == pytest.approx(150)


def test_eta_of_a_sweep_too_big_to_list_is_its_finished_trials_per_second() -> None:
    # Only the running trials are at hand: 250 of 1000 ended in 100 s, so 300 s for 750 more.
    running = [trial(n, TrialStatus.running, started=90) for n in (1, 2)]
    big = sweep(running, total=1000)
    big.counts[TrialStatus.succeeded] = 250
    big.counts[TrialStatus.queued] -= 250
    assert follow.eta_seconds(big, running, at(100)) == pytest.approx(300)
    assert "ETA 0:05:00" in text_of(follow.progress_view(big, running, at(100)))


def test_eta_with_no_trial_running_falls_back_to_the_rate() -> None:
    trials = [trial(1, TrialStatus.succeeded, started=0, ended=40), trial(2, TrialStatus.queued)]
    assert follow.eta_seconds(sweep(trials), trials, at(50)) == pytest.approx(50)


def test_eta_counts_a_trial_that_ended_after_the_sweep_was_read() -> None:
    trials = [trial(1, TrialStatus.succeeded, started=0, ended=40), trial(2, TrialStatus.queued)]
    before = sweep([trial(1, TrialStatus.running, started=0), trial(2, TrialStatus.queued)])
    assert follow.eta_seconds(before, trials, at(50)) == pytest.approx(50)


def test_eta_of_an_ended_sweep_is_zero() -> None:
    trials = [trial(1, TrialStatus.succeeded, started=0, ended=40)]
    assert follow.eta_seconds(sweep(trials), trials, at(50)) == 0.0


def test_the_best_trial_is_said_one_way_while_followed_and_once_shown_whole() -> None:
    best = trial(3, TrialStatus.running, started=0, objective=0.0421)
    line = render.best_text(sweep([best], best=best), so_far=True)
    assert line is not None
    assert line.plain == "best so far: trial 103  lr=0.003 bs=32  loss=0.0421"
    shown = render.best_text(sweep([best], best=best))
    assert shown is not None and shown.plain == "best: trial 103  lr=0.003 bs=32  loss=0.0421"
    unreported = sweep([trial(1, TrialStatus.running, started=0)])
    waiting = render.best_text(unreported, so_far=True)
    assert waiting is not None
    assert waiting.plain == "best so far: no trial has reported loss yet"
    missing = render.best_text(unreported)
    assert missing is not None and missing.plain == "best: no trial has reported loss"
    assert render.best_text(sweep([best], objective=None), so_far=True) is None


def test_the_live_view_shows_progress_best_eta_and_the_running_and_recent_trials() -> None:
    finished = [
        trial(n, TrialStatus.succeeded, started=0, ended=10 * n, objective=1.0 / n)
        for n in range(1, 8)
    ]
    failed = trial(
        8, TrialStatus.failed, started=0, ended=5, error="exited with code 1\nboom", exit_code=1
    )
    running = [trial(n, TrialStatus.running, started=70) for n in (9, 10)]
    trials = [*finished, failed, *running]
    view = text_of(follow.live_view(sweep(trials, total=12, best=finished[6]), trials, at(100)))
    lines = view.splitlines()
    assert "sweep 1" in lines[0]
    assert "8/12 finished" in lines[0]
    assert "2 running" in lines[0]
    assert "1 failed" in lines[0]
    assert "elapsed 0:01:40" in lines[0]
    assert "ETA " in lines[0] and "ETA —" not in lines[0]
    assert lines[1] == "best so far: trial 107  lr=0.007 bs=32  loss=0.142857"
    rows = [line for line in lines if line.startswith("│")]
    shown = [int(row.split("│")[1]) for row in rows]
    # The running trials, then the five that ended last, newest first; older ones left out.
    assert shown == [109, 110, 107, 106, 105, 104, 103]
    assert [cell.strip() for cell in rows[0].split("│")[3:6]] == ["running", "cpu/1", "30.0s"]


def test_event_lines_carry_the_eta_until_the_last_trial() -> None:
    ended = trial(1, TrialStatus.succeeded, started=0, ended=12.5, objective=0.5)
    line = follow.event_line(sweep([ended], total=4), ended, 1, eta=37.5)
    assert (
        line.plain == "[1/4] trial 101 lr=0.001 bs=32: succeeded (after 12.5s, loss=0.5); ETA 37.5s"
    )
    last = follow.event_line(sweep([ended], total=1), ended, 1, eta=0.0)
    assert "ETA" not in last.plain
    started = trial(2, TrialStatus.running, started=0)
    assert follow.event_line(sweep([started], total=4), started, 0, eta=37.5).plain == (
        "[0/4] trial 102 lr=0.002 bs=32: running in slot cpu/0"
    )


def test_an_adaptive_sweep_counts_the_trials_not_asked_yet_as_not_started() -> None:
    # A budget of 10, 4 asked: two ended after 100 s, two are 30 s into theirs on two slots.
    trials = [
        trial(1, TrialStatus.succeeded, started=0, ended=100),
        trial(2, TrialStatus.pruned, started=0, ended=100, step=3),
        trial(3, TrialStatus.running, started=100),
        trial(4, TrialStatus.running, started=100),
    ]
    adaptive = sweep(trials, budget=10)
    # 70 s left in each running trial, then six more of 100 s on two slots: 370 s.
    assert follow.eta_seconds(adaptive, trials, at(130)) == pytest.approx(370)
    line = text_of(follow.progress_view(adaptive, trials, at(130)))
    assert "2/10 finished" in line
    assert "2 running" in line and "0 failed" in line and "1 pruned" in line


def test_an_adaptive_sweep_cancelled_short_of_its_budget_ends_complete() -> None:
    trials = [
        trial(1, TrialStatus.succeeded, started=0, ended=100),
        trial(2, TrialStatus.succeeded, started=0, ended=100),
        trial(3, TrialStatus.cancelled, started=100, ended=120),
    ]
    cancelled = sweep(trials, budget=10, status=SweepStatus.cancelled)
    assert follow.eta_seconds(cancelled, trials, at(130)) == 0.0
    assert "3/3 finished" in text_of(follow.progress_view(cancelled, trials, at(130)))
    last = follow.event_line(cancelled, trials[2], 3, eta=0.0)
    assert last.plain == "[3/3] trial 103 lr=0.003 bs=32: cancelled (after 20.0s)"


def test_a_pruned_trial_says_in_one_phrase_at_which_step_it_lost_and_where_it_stopped() -> None:
    note = str(PruneNote(step=1, pruner="asha:min_resource=2", metric="loss", value=0.247823))
    pruned = trial(2, TrialStatus.pruned, started=0, ended=5, objective=0.9, step=6, error=note)
    line = follow.event_line(sweep([pruned], budget=8), pruned, 1, eta=40.0, steps=10)
    # The API's steps 1 and 6 are the user's 2nd and 7th: the pruner judged step 2's loss, and
    # the trial had reported up to step 7 by the time it was stopped.
    assert line.plain == (
        "[1/8] trial 102 lr=0.002 bs=32: pruned at step 2 of 10 by asha: loss 0.2478 "
        "(stopped at step 7, after 5.0s); ETA 40.0s"
    )
    at_once = trial(3, TrialStatus.pruned, started=0, ended=5, step=1, error=note)
    assert follow.event_line(sweep([at_once], budget=8), at_once, 1).plain == (
        "[1/8] trial 103 lr=0.003 bs=32: pruned at step 2 by asha: loss 0.2478 (after 5.0s)"
    )
