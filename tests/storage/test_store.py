from __future__ import annotations

from pathlib import Path

import pytest
from builders import ample_budget, joined_nodes, stored_running_trial, stored_sweep, sweep_plan
from sqlalchemy.orm import Session

from gpumux.fields import MAX_ID
from gpumux.schemas.reports import ReportIn
from gpumux.status import TRIAL_TRANSITIONS, SweepStatus, TrialStatus
from gpumux.storage import lifecycle
from gpumux.storage import owners as owner_store
from gpumux.storage import reports as report_store
from gpumux.storage import sweeps as sweep_store
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Trial, token_hash
from gpumux.storage.reports import Incoming


def test_create_sweep_queues_one_trial_per_parameter_set(
    sessions: Sessions, tmp_path: Path
) -> None:
    with sessions.write.begin() as session:
        sweep_id = stored_sweep(session, tmp_path, 4).id
    with sessions.read() as session:
        trials, count = trial_store.list_trials(session=session, sweep_id=sweep_id)
        sweep = sweep_store.get_sweep(session=session, sweep_id=sweep_id)
        assert sweep is not None and sweep.status == SweepStatus.queued
    assert count == 4
    assert [t.params for t in trials] == [{"x": 1}, {"x": 2}, {"x": 3}, {"x": 4}]
    assert {t.status for t in trials} == {TrialStatus.queued}


@pytest.mark.parametrize(
    ("start", "target"),
    [
        (start, target)
        for start in TrialStatus
        for target in TrialStatus
        if target not in TRIAL_TRANSITIONS[start]
    ],
)
def test_the_gate_refuses_every_illegal_transition(
    sessions: Sessions, tmp_path: Path, start: TrialStatus, target: TrialStatus
) -> None:
    with sessions.write.begin() as session:
        sweep = stored_sweep(session, tmp_path, 1)
        trial = trial_store.list_trials(session=session, sweep_id=sweep.id)[0][0]
        trial.status = start
        with pytest.raises(lifecycle.IllegalTransition, match=f"{start} -> {target}"):
            lifecycle.set_trial_status(session=session, trial=trial, status=target)
        assert trial.status == start


def test_sweep_status_follows_its_trials(sessions: Sessions, tmp_path: Path) -> None:
    with sessions.write.begin() as session:
        sweep = stored_sweep(session, tmp_path, 2)
        first, second = trial_store.list_trials(session=session, sweep_id=sweep.id)[0]
        lifecycle.set_trial_status(session=session, trial=first, status=TrialStatus.starting)
        assert sweep.status == SweepStatus.running
        lifecycle.set_trial_status(session=session, trial=first, status=TrialStatus.running)
        lifecycle.set_trial_status(session=session, trial=first, status=TrialStatus.succeeded)
        assert sweep.status == SweepStatus.running and sweep.finished_at is None
        lifecycle.set_trial_status(session=session, trial=second, status=TrialStatus.starting)
        lifecycle.set_trial_status(session=session, trial=second, status=TrialStatus.failed)
        assert sweep.status == SweepStatus.finished and sweep.finished_at is not None


def test_a_launch_clears_what_the_previous_attempt_left(sessions: Sessions, tmp_path: Path) -> None:
    def launch(session: Session, trial: Trial, token: str, memory_limit_mb: int | None) -> None:
        lifecycle.record_launch(
            session=session,
            trial=trial,
            node_id=None,
            device="cpu",
            slot=0,
            split=2,
            memory_limit_mb=memory_limit_mb,
            cpu_threads=None if memory_limit_mb is None else 2,
            token=token,
            log_path=str(tmp_path / "log"),
        )

    with sessions.write.begin() as session:
        sweep = stored_sweep(session, tmp_path, 1, objective="val_loss:min")
        [trial] = trial_store.list_trials(session=session, sweep_id=sweep.id)[0]
        launch(session, trial, "first", 4000)
        lifecycle.record_started(session=session, trial=trial, pid=4321, pid_started=7)
        report_store.add_line_reports(
            session=session,
            trial=trial,
            reports=[Incoming(step=3, samples=None, metrics={"val_loss": 0.4})],
            budget=ample_budget(),
            read_to=512,
        )
        lifecycle.requeue(session=session, trial=trial, why="was cut off", then="requeued")
        launch(session, trial, "second", None)
    with sessions.read() as session:
        [stored] = trial_store.list_trials(session=session, sweep_id=sweep.id)[0]
        assert (stored.status, stored.attempt, stored.split) == (TrialStatus.starting, 2, 2)
        assert stored.token_hash == token_hash("second")
        assert (stored.memory_limit_mb, stored.cpu_threads) == (None, None)
        left = (stored.step, stored.objective, stored.pid, stored.pid_started, stored.log_scanned)
        assert left == (None, None, None, None, 0)


def test_a_started_trial_runs_with_its_process_group(sessions: Sessions, tmp_path: Path) -> None:
    with sessions.write.begin() as session:
        sweep = stored_sweep(session, tmp_path, 2)
        starting, adopted = trial_store.list_trials(session=session, sweep_id=sweep.id)[0]
        for trial in (starting, adopted):
            lifecycle.set_trial_status(session=session, trial=trial, status=TrialStatus.starting)
        # Adopted by a restarted daemon, it was recorded running before its leader was seen.
        lifecycle.set_trial_status(session=session, trial=adopted, status=TrialStatus.running)
        lifecycle.record_started(session=session, trial=starting, pid=4321, pid_started=2**40)
        lifecycle.record_started(session=session, trial=adopted, pid=8765, pid_started=99)
    with sessions.read() as session:
        stored = trial_store.list_trials(session=session, sweep_id=sweep.id)[0]
        assert [(t.status, t.pid, t.pid_started) for t in stored] == [
            (TrialStatus.running, 4321, 2**40),
            (TrialStatus.running, 8765, 99),
        ]


def test_a_trial_written_before_nodes_existed_becomes_the_finders_own(
    sessions: Sessions, tmp_path: Path
) -> None:
    with sessions.write.begin() as session:
        here, there = joined_nodes(session, "here", "there")
        sweep = stored_sweep(session, tmp_path, 2)
        nodeless, elsewhere = trial_store.list_trials(session=session, sweep_id=sweep.id)[0]
        lifecycle.set_trial_status(
            session=session, trial=elsewhere, status=TrialStatus.starting, node_id=there
        )
        for trial in (nodeless, elsewhere):
            trial_store.adopt_nodeless(session=session, trial=trial, node_id=here)
    with sessions.read() as session:
        stored = trial_store.list_trials(session=session, sweep_id=sweep.id)[0]
        assert [t.node_id for t in stored] == [here, there]


def test_cancel_drops_queued_trials_in_one_statement(sessions: Sessions, tmp_path: Path) -> None:
    with sessions.write.begin() as session:
        sweep = stored_sweep(session, tmp_path, 5)
        first = trial_store.list_trials(session=session, sweep_id=sweep.id)[0][0]
        lifecycle.set_trial_status(session=session, trial=first, status=TrialStatus.starting)
        sweep_store.request_cancel(session=session, sweep=sweep)
        assert sweep_store.sweeps_to_cancel(session=session) == [sweep]
        assert lifecycle.cancel_queued_trials(session=session, sweep=sweep) == 4
        assert sweep.status == SweepStatus.running
        lifecycle.set_trial_status(session=session, trial=first, status=TrialStatus.cancelled)
        assert sweep.status == SweepStatus.cancelled
        assert sweep_store.sweeps_to_cancel(session=session) == []


def running_trial(sessions: Sessions, tmp_path: Path) -> int:
    with sessions.write.begin() as session:
        return stored_running_trial(session, tmp_path)


def test_a_report_updates_throughput_and_objective(sessions: Sessions, tmp_path: Path) -> None:
    trial_id = running_trial(sessions, tmp_path)
    report = ReportIn(
        trial_id=trial_id,
        attempt=1,
        kind="epoch",
        samples=1000,
        seconds=4,
        metrics={"val_loss": 0.5},
    )
    with sessions.write.begin() as session:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        report_store.add_report(
            budget=ample_budget(), session=session, trial=trial, token="secret", report_in=report
        )
    with sessions.read() as session:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        assert trial.samples_per_s == 250 and trial.objective == 0.5
        reports, count = report_store.list_reports(session=session, trial_id=trial_id)
        assert count == 1 and reports[0].metrics == {"val_loss": 0.5}


@pytest.mark.parametrize(
    ("token", "attempt", "message"),
    [("wrong", 1, "token does not match"), ("secret", 2, "report from attempt 2")],
)
def test_reports_with_a_wrong_token_or_attempt_are_refused(
    sessions: Sessions, tmp_path: Path, token: str, attempt: int, message: str
) -> None:
    trial_id = running_trial(sessions, tmp_path)
    report = ReportIn(trial_id=trial_id, attempt=attempt, kind="manual", metrics={"val_loss": 1})
    with sessions.write.begin() as session:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        with pytest.raises(report_store.ReportRefused, match=message):
            report_store.add_report(
                budget=ample_budget(), session=session, trial=trial, token=token, report_in=report
            )
        assert trial.objective is None


def test_best_trial_follows_the_objective_direction(sessions: Sessions, tmp_path: Path) -> None:
    with sessions.write.begin() as session:
        low = stored_sweep(session, tmp_path, 3, objective="acc:min")
        high = stored_sweep(session, tmp_path, 3, objective="acc:max")
        plain = stored_sweep(session, tmp_path, 3)
        for sweep in (low, high, plain):
            for trial, value in zip(
                trial_store.list_trials(session=session, sweep_id=sweep.id)[0],
                [0.2, 0.9, 0.5],
                strict=True,
            ):
                trial.objective = value
        session.flush()
        best_low = sweep_store.best_trial(session=session, sweep=low)
        best_high = sweep_store.best_trial(session=session, sweep=high)
        assert best_low is not None and best_low.objective == 0.2
        assert best_high is not None and best_high.objective == 0.9
        assert sweep_store.best_trial(session=session, sweep=plain) is None


def test_list_sweeps_pages_newest_first_and_filters(sessions: Sessions, tmp_path: Path) -> None:
    with sessions.write.begin() as session:
        ids = [stored_sweep(session, tmp_path, 1).id for _ in range(5)]
        bob = owner_store.get_or_create_owner(session=session, name="bob")
        sweep_store.create_sweep(
            session=session, plan=sweep_plan(tmp_path, seed=1, trial_params=[{}]), owner=bob
        )
    with sessions.read() as session:
        page, count = sweep_store.list_sweeps(session=session, owner="alice", offset=1, limit=2)
        assert count == 5 and [s.id for s in page] == ids[::-1][1:3]
        _, bobs = sweep_store.list_sweeps(session=session, owner="bob")
        assert bobs == 1
        _, finished = sweep_store.list_sweeps(session=session, status=SweepStatus.finished)
        assert finished == 0


def test_integers_past_2_31_are_kept_on_every_backend(sessions: Sessions, tmp_path: Path) -> None:
    # A seed the API takes, a uid of an LDAP directory, the start ticks of a trial on a host up
    # for a year: PostgreSQL's INTEGER ended at 2**31 - 1 before migration 0009.
    with sessions.write.begin() as session:
        owner = owner_store.get_or_create_owner(session=session, name="alice")
        owner.uid = 2**32 - 2
        sweep = sweep_store.create_sweep(
            session=session,
            plan=sweep_plan(tmp_path, seed=MAX_ID, trial_params=[{"n": 1}]),
            owner=owner,
        )
        trial = trial_store.list_trials(session=session, sweep_id=sweep.id)[0][0]
        trial.pid_started, trial.log_scanned = 2**40, 2**33
        ids = (sweep.id, trial.id)
    with sessions.read() as session:
        stored = sweep_store.get_sweep(session=session, sweep_id=ids[0])
        started = trial_store.get_trial(session=session, trial_id=ids[1])
        assert stored is not None and started is not None
        assert (stored.seed, stored.owner.uid) == (MAX_ID, 2**32 - 2)
        assert (started.pid_started, started.log_scanned) == (2**40, 2**33)
