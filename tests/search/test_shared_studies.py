"""Studies of one sweep kept by several nodes over one database: each node's study holds every
trial whichever node asked or ended it, and its pruner reads every report, whatever the order
in which their ids or their ends' clocks land. Each node is a `Studies` of its own here, over
SQLite and over PostgreSQL; tests/cluster/test_adaptive.py runs real daemons."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from builders import adaptive_sweep, stored_sweep
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from test_studies import ask, end, end_running, prune, report

from gpumux.search.studies import Studies
from gpumux.status import TrialStatus
from gpumux.storage import lifecycle
from gpumux.storage import trials as trial_store
from gpumux.storage.budget import COALESCE_S, ReportBudget, Verdict
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Trial, TrialReport, utcnow
from gpumux.storage.reports import Incoming, add_line_reports

on_both = pytest.mark.parametrize("backend", ["sqlite", "postgresql"])


def held(studies: Studies, sweep_id: int) -> list[tuple[int, str, float | None]]:
    """What a node's study holds: each Optuna trial's number, state and value."""
    study = studies._studies[sweep_id].study
    return [(t.number, t.state.name, t.value) for t in study.get_trials()]


@on_both
def test_a_trial_another_node_asked_and_ended_between_two_looks_is_told(
    sessions: Sessions, tmp_path: Path
) -> None:
    with sessions.write.begin() as session:
        sweep_id = adaptive_sweep(session, tmp_path, 4).id
    node_a, node_b = Studies(), Studies()
    first = ask(node_a, sessions, sweep_id)
    # Node b asks, runs and ends a trial while node a has no reason to look.
    second = ask(node_b, sessions, sweep_id)
    assert first is not None and second is not None
    end(sessions, second.id, TrialStatus.succeeded, 0.25)
    third = ask(node_a, sessions, sweep_id)
    assert third is not None
    assert [first.number, second.number, third.number] == [0, 1, 2]
    # Node a's sampler learns from node b's trial, under the trial's own number.
    assert held(node_a, sweep_id) == [
        (0, "RUNNING", None),
        (1, "COMPLETE", 0.25),
        (2, "RUNNING", None),
    ]


@on_both
def test_an_end_stamped_by_a_clock_behind_this_nodes_is_told(
    sessions: Sessions, tmp_path: Path
) -> None:
    with sessions.write.begin() as session:
        sweep_id = adaptive_sweep(session, tmp_path, 4).id
    studies = Studies()
    first, second = ask(studies, sessions, sweep_id), ask(studies, sessions, sweep_id)
    assert first is not None and second is not None
    end(sessions, second.id, TrialStatus.succeeded, 0.5)
    assert ask(studies, sessions, sweep_id) is not None
    # The first trial ends on another node, whose clock is 5 s behind this one's.
    with sessions.write.begin() as session:
        trial = trial_store.get_trial(session=session, trial_id=first.id)
        assert trial is not None
        lifecycle.set_trial_status(session=session, trial=trial, status=TrialStatus.starting)
        lifecycle.set_trial_status(session=session, trial=trial, status=TrialStatus.running)
        trial.objective = 0.125
        lifecycle.set_trial_status(
            session=session,
            trial=trial,
            status=TrialStatus.succeeded,
            ended_at=utcnow() - timedelta(seconds=5),
        )
    assert ask(studies, sessions, sweep_id) is not None
    assert held(studies, sweep_id)[:2] == [(0, "COMPLETE", 0.125), (1, "COMPLETE", 0.5)]


def median_pruned(sessions: Sessions, tmp_path: Path) -> tuple[int, int, int]:
    """A sweep minimising loss under the median of one finished trial, whose steps 0-2 held
    1.0; the sweep's id and two trials, running."""
    with sessions.write.begin() as session:
        sweep_id = stored_sweep(
            session, tmp_path, 3, objective="loss:min", prune="median:n_startup_trials=1"
        ).id
        good, one, other = (
            t.id for t in trial_store.list_trials(session=session, sweep_id=sweep_id)[0]
        )
    for step in range(3):
        report(sessions, good, step, 1.0)
    end(sessions, good, TrialStatus.succeeded, 1.0)
    end_running(sessions, one)
    end_running(sessions, other)
    return sweep_id, one, other


@on_both
def test_a_report_merged_into_its_steps_row_after_a_look_is_judged(
    sessions: Sessions, tmp_path: Path
) -> None:
    sweep_id, trial_id, _ = median_pruned(sessions, tmp_path)
    now = [0.0]
    budget = ReportBudget(rate=1e6, burst=10**6, rows=10**6, clock=lambda: now[0])

    def line(loss: float) -> Verdict:
        with sessions.write.begin() as session:
            trial = trial_store.get_trial(session=session, trial_id=trial_id)
            assert trial is not None
            reports = [Incoming(step=0, samples=None, metrics={"loss": loss})]
            return add_line_reports(
                session=session, trial=trial, reports=reports, budget=budget, read_to=0
            )[0]

    studies = Studies()
    # The first batches of step 0 hold the median; the step ends far worse, within the second
    # in which its reports share a row.
    assert line(0.5) is Verdict.row
    assert prune(studies, sessions, sweep_id) == []
    now[0] += COALESCE_S / 2
    assert line(5.0) is Verdict.merge
    with sessions.read() as session:
        rows = select(func.count()).select_from(TrialReport)
        assert session.scalar(rows.where(TrialReport.trial_id == trial_id)) == 1
    assert prune(studies, sessions, sweep_id) == [(trial_id, 0)]


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_report_that_commits_after_a_later_id_is_judged(
    sessions: Sessions, tmp_path: Path
) -> None:
    sweep_id, late, early = median_pruned(sessions, tmp_path)
    studies = Studies()
    # A transaction takes the next report id and is slow to commit (PostgreSQL promises no
    # order of commits for the ids of a sequence); SQLite cannot run two writers at once.
    with Session(sessions.engine) as slow:
        trial = slow.get(Trial, late)
        assert trial is not None
        slow.add(
            TrialReport(
                trial_id=late, attempt=trial.attempt, kind="line", step=0, metrics={"loss": 5.0}
            )
        )
        trial.step, trial.last_report_at = 0, utcnow()
        slow.flush()
        report(sessions, early, 0, 0.9)
        assert prune(studies, sessions, sweep_id) == []
        slow.commit()
    with sessions.read() as session:
        ids = session.scalars(
            select(TrialReport.trial_id)
            .where(TrialReport.trial_id.in_([late, early]))
            .order_by(TrialReport.id)
        ).all()
    assert ids == [late, early]
    assert prune(studies, sessions, sweep_id) == [(late, 0)]
