"""The next trials: what the scheduler offers free slots, asked of each open sweep."""

from __future__ import annotations

from pathlib import Path

from builders import adaptive_sweep, stored_sweep

from gpumux.scheduling.next_trials import next_trials
from gpumux.status import TrialStatus
from gpumux.storage import lifecycle
from gpumux.storage import sweeps as sweep_store
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Trial


def test_next_trials_are_first_come_first_served_and_skip_cancelled_sweeps(
    sessions: Sessions, tmp_path: Path
) -> None:
    with sessions.write.begin() as session:
        older, cancelled, newer = (stored_sweep(session, tmp_path, 2) for _ in range(3))
        sweep_store.request_cancel(session=session, sweep=cancelled)
        queued = next_trials(session=session, limit=10)
    assert [t.sweep_id for t in queued] == [older.id, older.id, newer.id, newer.id]
    assert [t.id for t in queued] == sorted(t.id for t in queued)


def test_a_higher_priority_sweep_goes_ahead_of_older_ones(
    sessions: Sessions, tmp_path: Path
) -> None:
    with sessions.write.begin() as session:
        older = stored_sweep(session, tmp_path, 2)
        urgent = stored_sweep(session, tmp_path, 2, priority=5)
        later = stored_sweep(session, tmp_path, 2, priority=-1)
        queued = next_trials(session=session, limit=5)
    assert [t.sweep_id for t in queued] == [urgent.id, urgent.id, older.id, older.id, later.id]


def test_each_owner_is_offered_at_most_the_limit_so_one_big_sweep_hides_no_one(
    sessions: Sessions, tmp_path: Path
) -> None:
    with sessions.write.begin() as session:
        big = stored_sweep(session, tmp_path, 50, owner="alice")
        more = stored_sweep(session, tmp_path, 5, owner="alice")
        bobs = stored_sweep(session, tmp_path, 3, owner="bob")
        queued = next_trials(session=session, limit=4)
    by_sweep = [t.sweep_id for t in queued]
    assert by_sweep == [big.id] * 4 + [bobs.id] * 3
    assert more.id not in by_sweep


def test_only_queued_trials_are_offered_in_their_order(sessions: Sessions, tmp_path: Path) -> None:
    with sessions.write.begin() as session:
        sweep = stored_sweep(session, tmp_path, 4)
        first, second, *_ = trial_store.list_trials(session=session, sweep_id=sweep.id)[0]
        lifecycle.set_trial_status(session=session, trial=second, status=TrialStatus.starting)
        queued = next_trials(session=session, limit=10)
    assert [t.trial.params["x"] for t in queued if t.trial] == [1, 3, 4]
    assert first.status is TrialStatus.queued


def test_an_adaptive_sweep_offers_its_queued_trials_then_the_rest_of_its_budget_unasked(
    sessions: Sessions, tmp_path: Path
) -> None:
    with sessions.write.begin() as session:
        sweep = adaptive_sweep(session, tmp_path, 5)
        other = adaptive_sweep(session, tmp_path, 2)
        # Two of its trials were asked before: one runs, one waits (a restart cut it off).
        asked = [Trial(sweep_id=sweep.id, number=n, params={"x": n}) for n in (0, 1)]
        session.add_all(asked)
        session.flush()
        lifecycle.set_trial_status(session=session, trial=asked[0], status=TrialStatus.starting)
        offered = next_trials(session=session, limit=10)
        capped = next_trials(session=session, limit=2)
    mine = [t for t in offered if t.sweep_id == sweep.id]
    assert [t.id for t in mine[:1]] == [asked[1].id] and mine[0].asked
    # Five in the budget, two asked: three more may be asked, and no more.
    assert len(mine) == 4 and not any(t.asked for t in mine[1:])
    theirs = [t for t in offered if t.sweep_id == other.id]
    assert len(theirs) == 2 and not any(t.asked for t in theirs)
    unasked = [t.id for t in offered if not t.asked]
    assert all(i < 0 for i in unasked) and len(set(unasked)) == len(unasked) == 5
    assert [(t.sweep_id, t.asked) for t in capped] == [(sweep.id, True), (sweep.id, False)]
