"""The daemon's Optuna studies: asked trials stored, studies rebuilt from the database, pruning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from builders import adaptive_sweep, stored_sweep

from gpumux.search import methods
from gpumux.search.studies import SamplerFailed, Studies
from gpumux.status import SearchMethod, TrialStatus
from gpumux.storage import lifecycle
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Sweep, Trial, TrialReport, utcnow


def ask(studies: Studies, sessions: Sessions, sweep_id: int) -> Trial | None:
    with sessions.write.begin() as session:
        sweep = session.get(Sweep, sweep_id)
        assert sweep is not None
        trial = studies.ask(session=session, sweep=sweep)
        trial_id = None if trial is None else trial.id
    if trial_id is None:
        return None
    with sessions.read() as session:
        return trial_store.get_trial(session=session, trial_id=trial_id)


def end(sessions: Sessions, trial_id: int, status: TrialStatus, objective: float | None) -> None:
    with sessions.write.begin() as session:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        if trial.status is TrialStatus.queued:
            lifecycle.set_trial_status(session=session, trial=trial, status=TrialStatus.starting)
        lifecycle.set_trial_status(session=session, trial=trial, status=TrialStatus.running)
        trial.objective = objective
        lifecycle.set_trial_status(session=session, trial=trial, status=status, ended_at=utcnow())


def report(
    sessions: Sessions, trial_id: int, step: int, loss: float, *, metric: str = "loss"
) -> None:
    with sessions.write.begin() as session:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        session.add(
            TrialReport(
                trial_id=trial_id,
                attempt=trial.attempt,
                kind="line",
                step=step,
                metrics={metric: loss},
            )
        )
        # As every report's transaction does (storage/reports.py).
        trial.step, trial.last_report_at = step, utcnow()


class BrokenSampler(optuna.samplers.RandomSampler):
    def sample_independent(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError("this sampler is broken")


def test_a_sampler_that_fails_ends_the_budget_with_the_trials_asked(
    sessions: Sessions, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with sessions.write.begin() as session:
        sweep_id = adaptive_sweep(session, tmp_path, 5).id
    studies = Studies()
    assert ask(studies, sessions, sweep_id) is not None
    assert ask(studies, sessions, sweep_id) is not None
    monkeypatch.setattr(methods, "make_sampler", lambda *args, **kwargs: BrokenSampler())
    studies.forget([sweep_id])
    with sessions.write.begin() as session:
        sweep = session.get(Sweep, sweep_id)
        assert sweep is not None
        with pytest.raises(SamplerFailed, match="this sampler is broken"):
            studies.ask(session=session, sweep=sweep)
    with sessions.read() as session:
        sweep = session.get(Sweep, sweep_id)
        assert sweep is not None and sweep.trial_count == 2
    assert ask(studies, sessions, sweep_id) is None


def test_asked_trials_are_stored_within_the_space_up_to_the_budget(
    sessions: Sessions, tmp_path: Path
) -> None:
    with sessions.write.begin() as session:
        sweep_id = adaptive_sweep(session, tmp_path, 3, "x=1..100", "bs=32,64", "data=/d").id
    studies = Studies()
    asked = [ask(studies, sessions, sweep_id) for _ in range(4)]
    assert asked[3] is None
    trials = [trial for trial in asked if trial is not None]
    assert [t.number for t in trials] == [0, 1, 2]
    for trial in trials:
        assert set(trial.params) == {"x", "bs", "data"} and trial.params["data"] == "/d"
        assert isinstance(trial.params["x"], int) and 1 <= trial.params["x"] <= 100
        assert trial.params["bs"] in (32, 64) and trial.status is TrialStatus.queued
    with sessions.read() as session:
        stored = trial_store.list_trials(session=session, sweep_id=sweep_id)[0]
    assert [t.params for t in stored] == [t.params for t in trials]


def test_the_same_seed_replays_the_same_asks(sessions: Sessions, tmp_path: Path) -> None:
    with sessions.write.begin() as session:
        first, second = (adaptive_sweep(session, tmp_path, 4).id for _ in range(2))
    studies = Studies()
    one = [ask(studies, sessions, first) for _ in range(4)]
    two = [ask(studies, sessions, second) for _ in range(4)]
    assert [t.params for t in one if t] == [t.params for t in two if t]
    assert len({tuple(sorted(t.params.items())) for t in one if t}) == 4


@pytest.mark.parametrize("search", [SearchMethod.qmc, SearchMethod.cmaes, SearchMethod.tpe])
def test_a_study_rebuilt_after_a_restart_goes_on_where_it_stopped(
    sessions: Sessions, tmp_path: Path, search: SearchMethod
) -> None:
    with sessions.write.begin() as session:
        straight = adaptive_sweep(session, tmp_path, 8, search=search).id
        restarted = adaptive_sweep(session, tmp_path, 8, search=search).id

    def run(sweep_id: int, restart_after: int | None) -> list[dict[str, object]]:
        studies = Studies()
        params = []
        for n in range(8):
            if n == restart_after:
                studies = Studies()
            trial = ask(studies, sessions, sweep_id)
            assert trial is not None
            params.append(trial.params)
            end(sessions, trial.id, TrialStatus.succeeded, float(trial.params["x"]))
        return params

    before = run(straight, None)
    after = run(restarted, 5)
    # Nothing is asked twice, the rebuilt study keeps what it learnt, and where the sampler's
    # draws depend only on its stored state (QMC's position), the restart changes nothing.
    assert len({tuple(sorted(p.items())) for p in after}) == 8
    assert after[:5] == before[:5]
    if search is SearchMethod.qmc:
        assert after == before


def test_a_finished_trial_is_told_to_the_study_before_the_next_ask(
    sessions: Sessions, tmp_path: Path
) -> None:
    with sessions.write.begin() as session:
        sweep_id = adaptive_sweep(session, tmp_path, 3).id
    studies = Studies()
    first = ask(studies, sessions, sweep_id)
    assert first is not None
    end(sessions, first.id, TrialStatus.succeeded, 0.5)
    second = ask(studies, sessions, sweep_id)
    assert second is not None
    end(sessions, second.id, TrialStatus.failed, None)
    assert ask(studies, sessions, sweep_id) is not None
    study = studies._studies[sweep_id].study
    assert [t.state.name for t in study.get_trials()] == ["COMPLETE", "FAIL", "RUNNING"]
    assert study.best_value == 0.5


def test_the_pruner_stops_a_trial_worse_than_the_median_at_its_step(
    sessions: Sessions, tmp_path: Path
) -> None:
    sweep_id, (good, bad, fair) = median_pruned(sessions, tmp_path, 3)
    for step in range(3):
        report(sessions, good, step, 1.0 / (step + 1))
    end(sessions, good, TrialStatus.succeeded, 1 / 3)
    for trial_id in (bad, fair):
        end_running(sessions, trial_id)
    report(sessions, bad, 0, 5.0)
    report(sessions, fair, 0, 0.9)
    studies = Studies()
    assert prune(studies, sessions, sweep_id) == [(bad, 0)]
    # Nothing new reported: nothing decided again; a pruned trial is not judged again.
    assert prune(studies, sessions, sweep_id) == []
    report(sessions, bad, 1, 4.0)
    report(sessions, fair, 1, 0.8)
    assert prune(studies, sessions, sweep_id) == [(fair, 1)]


def test_a_step_whose_objective_comes_in_a_later_report_is_still_judged(
    sessions: Sessions, tmp_path: Path
) -> None:
    sweep_id, (good, bad) = median_pruned(sessions, tmp_path, 2, objective="val_loss:min")
    report(sessions, good, 0, 1.0, metric="val_loss")
    end(sessions, good, TrialStatus.succeeded, 1.0)
    end_running(sessions, bad)
    studies = Studies()
    # Training loss first, the validation loss of the same step in a report of its own.
    report(sessions, bad, 0, 0.1, metric="loss")
    assert prune(studies, sessions, sweep_id) == []
    report(sessions, bad, 0, 9.0, metric="val_loss")
    assert prune(studies, sessions, sweep_id) == [(bad, 0)]


def test_after_a_restart_the_pruner_judges_a_running_trials_steps_in_order(
    sessions: Sessions, tmp_path: Path
) -> None:
    sweep_id, (good, late) = median_pruned(sessions, tmp_path, 2)
    for step, loss in enumerate([1.0, 1.0, 0.1, 0.1]):
        report(sessions, good, step, loss)
    end(sessions, good, TrialStatus.succeeded, 0.1)
    end_running(sessions, late)
    # Four steps no daemon has judged yet: its best (0.9) holds the median (1.0) at steps 0
    # and 1, and loses from step 2 (0.5 against 0.1). Judged at its last step only, it would
    # be pruned too, but without the step it lost at.
    for step, loss in enumerate([0.9, 0.9, 0.5, 0.5]):
        report(sessions, late, step, loss)
    assert prune(Studies(), sessions, sweep_id) == [(late, 2)]


def median_pruned(
    sessions: Sessions, tmp_path: Path, n: int, *, objective: str = "loss:min"
) -> tuple[int, list[int]]:
    """A grid sweep of `n` trials pruned by the median of one finished trial; its trial ids."""
    with sessions.write.begin() as session:
        sweep_id = stored_sweep(
            session, tmp_path, n, objective=objective, prune="median:n_startup_trials=1"
        ).id
        trials = trial_store.list_trials(session=session, sweep_id=sweep_id)[0]
        return sweep_id, [trial.id for trial in trials]


def end_running(sessions: Sessions, trial_id: int) -> None:
    with sessions.write.begin() as session:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        lifecycle.set_trial_status(session=session, trial=trial, status=TrialStatus.starting)
        lifecycle.set_trial_status(session=session, trial=trial, status=TrialStatus.running)


def prune(studies: Studies, sessions: Sessions, sweep_id: int) -> list[tuple[int, int]]:
    with sessions.write.begin() as session:
        sweep = session.get(Sweep, sweep_id)
        assert sweep is not None
        return [(d.trial_id, d.step) for d in studies.to_prune(session=session, sweeps=[sweep])]


def pruned_sweep(sessions: Sessions, tmp_path: Path, n: int, prune: str) -> list[int]:
    """The trial ids of a grid sweep of `n` trials minimising loss under `prune`."""
    with sessions.write.begin() as session:
        sweep_id = stored_sweep(session, tmp_path, n, objective="loss:min", prune=prune).id
        return [t.id for t in trial_store.list_trials(session=session, sweep_id=sweep_id)[0]]


def run_through(
    studies: Studies, sessions: Sessions, trial_id: int, losses: list[float]
) -> list[tuple[int, int]]:
    """Run the trial, reporting `losses` step by step, the pruner judging after each step as the
    scheduler's tick would; what it pruned. A trial left unpruned ends succeeded."""
    end_running(sessions, trial_id)
    with sessions.read() as session:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        sweep_id = trial.sweep_id
    for step, loss in enumerate(losses):
        report(sessions, trial_id, step, loss)
        if decided := prune(studies, sessions, sweep_id):
            return decided
    with sessions.write.begin() as session:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        trial.objective = losses[-1]
        lifecycle.set_trial_status(
            session=session, trial=trial, status=TrialStatus.succeeded, ended_at=utcnow()
        )
    return []


def test_asha_stops_a_losing_trial_at_its_first_rung_and_not_before(
    sessions: Sessions, tmp_path: Path
) -> None:
    # Rungs at min_resource * reduction_factor ** (min_early_stopping_rate + k): steps 2, 4, 8.
    *good, bad = pruned_sweep(sessions, tmp_path, 4, "asha:min_resource=2,reduction_factor=2")
    studies = Studies()
    for trial_id in good:
        assert run_through(studies, sessions, trial_id, [0.5, 0.4, 0.3, 0.2, 0.1]) == []
    assert run_through(studies, sessions, bad, [5.0] * 5) == [(bad, 2)]


def test_hyperband_stops_a_losing_trial_at_a_rung_of_its_bracket(
    sessions: Sessions, tmp_path: Path
) -> None:
    # Brackets of successive halving from step 1 to 9 in thirds: their first rungs are 1, 3, 9.
    *good, bad = pruned_sweep(
        sessions, tmp_path, 13, "hyperband:min_resource=1,max_resource=9,reduction_factor=3"
    )
    studies = Studies()
    for trial_id in good:
        run_through(studies, sessions, trial_id, [0.1] * 10)
    assert [step for _, step in run_through(studies, sessions, bad, [5.0] * 10)] in ([1], [3])


def test_the_median_pruner_waits_for_its_warm_up_steps(sessions: Sessions, tmp_path: Path) -> None:
    good, bad = pruned_sweep(sessions, tmp_path, 2, "median:n_startup_trials=1,n_warmup_steps=3")
    studies = Studies()
    assert run_through(studies, sessions, good, [0.1] * 6) == []
    assert run_through(studies, sessions, bad, [5.0] * 6) == [(bad, 3)]
