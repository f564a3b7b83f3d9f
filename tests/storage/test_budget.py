"""The report budget: new rows at a rate with a burst, a total per attempt, one row per step and
second, and what goes over it dropped and counted with its samples kept."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from builders import stored_running_trial

from gpumux.storage import reports as report_store
from gpumux.storage import trials as trial_store
from gpumux.storage.budget import Allowance, ReportBudget, Seed, Verdict
from gpumux.storage.engine import Sessions
from gpumux.storage.reports import Incoming


def allowance(*, rate: float = 2.0, burst: int = 3, limit: int = 100) -> Allowance:
    return Allowance(rate=rate, burst=burst, limit=limit, tokens=float(burst), at=0.0)


def test_a_step_of_its_own_takes_a_row_whatever_the_rate_within_the_total() -> None:
    budget = allowance(rate=0.001, burst=1, limit=5)
    assert [budget.decide(step, 0.0) for step in range(8)] == [Verdict.row] * 5 + [Verdict.drop] * 3
    assert budget.rows == 5


def test_a_step_again_a_second_on_takes_a_row_within_the_rate_else_updates_its_row() -> None:
    budget = allowance(rate=0.5, burst=1)
    assert budget.decide(0, 0.0) is Verdict.row
    # 1.5 s at half a token a second: no token yet for another row of step 0.
    assert budget.decide(0, 1.5) is Verdict.merge
    assert budget.decide(0, 3.0) is Verdict.row
    # A report of no step, over the rate, is dropped (its samples kept on the latest row).
    assert budget.decide(None, 3.0) is Verdict.drop
    # Never more than the burst, however long the pause.
    assert [budget.decide(None, t) for t in (100.0, 100.0)] == [Verdict.row, Verdict.merge]
    assert budget.decide(0, 100.0) is Verdict.row
    assert budget.decide(0, 101.5) is Verdict.merge


def test_a_step_reported_again_within_a_second_updates_its_row() -> None:
    budget = allowance(rate=1.0, burst=1)
    assert budget.decide(0, 0.0) is Verdict.row
    assert [budget.decide(0, t) for t in (0.1, 0.5, 0.9)] == [Verdict.merge] * 3
    # A second on: a new row of the same step (the split search sees the reports' spacing).
    assert budget.decide(0, 1.5) is Verdict.row


def test_over_the_budget_the_latest_step_still_updates_its_row_and_others_are_dropped() -> None:
    budget = allowance(rate=0.001, burst=1, limit=2)
    assert budget.decide(3, 0.0) is Verdict.row
    assert budget.decide(3, 5.0) is Verdict.merge
    assert budget.decide(4, 5.0) is Verdict.row
    assert budget.decide(5, 5.0) is Verdict.drop
    assert budget.decide(4, 9.0) is Verdict.merge
    assert budget.decide(None, 9.0) is Verdict.drop


def test_an_attempt_keeps_no_more_rows_than_its_total() -> None:
    budget = allowance(rate=1000.0, burst=1000, limit=4)
    verdicts = [budget.decide(step, step * 2.0) for step in range(10)]
    assert verdicts == [Verdict.row] * 4 + [Verdict.drop] * 6
    assert budget.rows == 4


def test_an_attempts_end_leaves_a_later_attempt_of_the_trial_its_allowance() -> None:
    budget = ReportBudget(rate=1.0, burst=2, rows=100, clock=lambda: 0.0)
    seeded: list[tuple[int, int]] = []

    def seed(trial_id: int, attempt: int) -> Callable[[], Seed]:
        def stored() -> Seed:
            seeded.append((trial_id, attempt))
            return 0, None, None

        return stored

    budget.allowance(7, 1, seed(7, 1))
    other = budget.allowance(8, 1, seed(8, 1))
    # Trial 7's retry starts reporting before the end of its first attempt is recorded.
    retry = budget.allowance(7, 2, seed(7, 2))
    assert budget.decide(retry, None) is Verdict.row
    budget.end([(7, 1), (8, 1)])
    assert len(budget) == 1
    # The retry keeps its own: its latest row that report's (the next merges into it), not
    # counted again from the database as a fresh attempt would be.
    kept = budget.allowance(7, 2, seed(7, 2))
    assert kept is retry
    assert budget.decide(kept, None) is Verdict.merge
    assert budget.allowance(8, 1, seed(8, 1)) is not other
    assert seeded == [(7, 1), (8, 1), (7, 2), (8, 1)]


def test_an_attempts_end_also_ends_an_earlier_attempt_a_late_report_made_again() -> None:
    budget = ReportBudget(rate=1.0, burst=2, rows=100, clock=lambda: 0.0)
    budget.allowance(7, 2, lambda: (0, None, None))
    # A report of attempt 1, read after its end was taken: its allowance made again.
    budget.allowance(7, 1, lambda: (0, None, None))
    budget.allowance(8, 3, lambda: (0, None, None))
    assert len(budget) == 3, "the late report leaves the running attempt 2 its allowance"
    budget.end([(7, 2)])
    assert len(budget) == 1, "trial 8's running attempt alone is held"


def running(sessions: Sessions, tmp_path: Path) -> int:
    with sessions.write.begin() as session:
        return stored_running_trial(session, tmp_path, device="cpu")


def report_lines(
    sessions: Sessions, trial_id: int, budget: ReportBudget, lines: list[tuple[int, float]]
) -> None:
    """Lines of (step, val_loss), one sample each, recorded one by one."""
    with sessions.write.begin() as session:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        for line, (step, value) in enumerate(lines, 1):
            report_store.add_line_reports(
                session=session,
                trial=trial,
                reports=[Incoming(step=step, samples=1.0, metrics={"val_loss": value})],
                budget=budget,
                read_to=line * 64,
            )


def test_a_flood_stores_a_bounded_number_of_rows_and_keeps_each_steps_last_value_and_samples(
    sessions: Sessions, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trial_id = running(sessions, tmp_path)
    # The clock stands still: on a loaded host the 500 lines of the first steps can take over a
    # second, and a step reported again a second on takes a row of its own.
    budget = ReportBudget(rate=1.0, burst=5, rows=8, clock=lambda: 0.0)
    # 5 steps reported 100 times each (coalesced), then 1,000 new steps (over the budget).
    lines = [(step, step * 1000.0 + i) for step in range(5) for i in range(100)]
    lines += [(5 + j, float(j)) for j in range(1000)]
    with caplog.at_level(logging.WARNING, logger="gpumux.storage.reports"):
        report_lines(sessions, trial_id, budget, lines)
        report_lines(sessions, trial_id, budget, [(2000, 1.0)])

    with sessions.read() as session:
        reports, count = report_store.list_reports(session=session, trial_id=trial_id)
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        assert count == 8
        last = {report.step: report.metrics["val_loss"] for report in reports}
        assert {step: last[step] for step in range(5)} == {s: s * 1000.0 + 99 for s in range(5)}
        # Every sample counts, the dropped reports' too.
        assert sum(report.samples or 0 for report in reports) == len(lines) + 1
        assert trial.reports_dropped == 1001 - (8 - 5)
        # The trial's own row follows the last report, stored or not.
        assert (trial.step, trial.objective) == (2000, 1.0)
    dropping = [r for r in caplog.records if "over its budget" in r.getMessage()]
    assert len(dropping) == 1, "said once per attempt"


def test_a_restarted_daemon_counts_the_rows_an_attempt_already_stored(
    sessions: Sessions, tmp_path: Path
) -> None:
    trial_id = running(sessions, tmp_path)
    report_lines(sessions, trial_id, ReportBudget(rate=1.0, burst=3, rows=3), [(0, 1.0), (1, 2.0)])
    again = ReportBudget(rate=1.0, burst=3, rows=3)
    report_lines(sessions, trial_id, again, [(1, 3.0), (2, 4.0), (3, 5.0)])
    with sessions.read() as session:
        reports, count = report_store.list_reports(session=session, trial_id=trial_id)
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
    # Its two rows count: one more is allowed (step 1 again, its last value), then none.
    assert count == 3
    assert [(r.step, r.metrics["val_loss"]) for r in reports] == [(0, 1.0), (1, 2.0), (1, 3.0)]
    assert trial.reports_dropped == 2
