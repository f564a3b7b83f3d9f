"""Report lines the daemon read from a trial's log, recorded like the reports a trial sends."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from builders import ample_budget, joined_nodes, stored_running_trial, stored_sweep

from gpumux.fields import MAX_SAMPLES
from gpumux.schemas.reports import ReportIn
from gpumux.status import TrialStatus
from gpumux.storage import lifecycle
from gpumux.storage import reports as report_store
from gpumux.storage import trials as trial_store
from gpumux.storage.budget import Verdict
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Trial, TrialReport, utcnow
from gpumux.storage.reports import Incoming


def running_trial(sessions: Sessions, tmp_path: Path) -> int:
    """A running trial of a sweep whose objective is val_loss, on the CPU device, attempt 2."""
    with sessions.write.begin() as session:
        return stored_running_trial(session, tmp_path, attempt=2, device="cpu")


def the_trial(sessions: Sessions, trial_id: int) -> Trial:
    with sessions.read() as session:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        return trial


def test_a_line_report_sets_the_step_and_the_objective(sessions: Sessions, tmp_path: Path) -> None:
    trial_id = running_trial(sessions, tmp_path)
    with sessions.write.begin() as session:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        report_in = ReportIn(trial_id=trial_id, attempt=2, kind="manual", samples=100, seconds=4)
        report_store.add_report(
            budget=ample_budget(), session=session, trial=trial, token="secret", report_in=report_in
        )
        [verdict] = report_store.add_line_reports(
            budget=ample_budget(),
            session=session,
            trial=trial,
            reports=[Incoming(step=3, samples=512.0, metrics={"val_loss": 0.41})],
            read_to=4096,
        )
        assert verdict is Verdict.row

    trial = the_trial(sessions, trial_id)
    assert (trial.step, trial.objective) == (3, 0.41)
    assert trial.log_scanned == 4096, "a restarted daemon reads on from the lines recorded"
    assert trial.samples_per_s == 25, "a line has no interval: the last measured rate stays"
    with sessions.read() as session:
        reports, count = report_store.list_reports(session=session, trial_id=trial_id)
        stored = reports[-1]
        assert count == 2
        assert (stored.kind, stored.attempt, stored.step, stored.samples) == ("line", 2, 3, 512)
        assert (stored.seconds, stored.samples_per_s) == (None, None)
        assert stored.metrics == {"val_loss": 0.41}
        assert stored.at == trial.last_report_at
        # The split search counts a line's samples in its windows like any report's.
        window = (reports[0].at - timedelta(seconds=1), stored.at)
        times = report_store.report_times(
            session=session, trial_ids=[trial_id], start=window[0], end=window[1]
        )
        assert sum(samples for _, samples in times[trial_id]) == 612


def test_a_line_without_step_or_objective_keeps_them(sessions: Sessions, tmp_path: Path) -> None:
    trial_id = running_trial(sessions, tmp_path)
    with sessions.write.begin() as session:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        report_store.add_line_reports(
            budget=ample_budget(),
            session=session,
            trial=trial,
            reports=[Incoming(step=1, samples=None, metrics={"val_loss": 0.5})],
            read_to=100,
        )
        report_store.add_line_reports(
            budget=ample_budget(),
            session=session,
            trial=trial,
            reports=[Incoming(step=None, samples=None, metrics={"loss": 0.1})],
            read_to=200,
        )

    trial = the_trial(sessions, trial_id)
    assert (trial.step, trial.objective, trial.samples_per_s) == (1, 0.5, None)


def test_the_last_lines_of_a_trial_that_just_ended_are_recorded(
    sessions: Sessions, tmp_path: Path
) -> None:
    # The daemon may read the end of the log after it recorded the exit.
    trial_id = running_trial(sessions, tmp_path)
    with sessions.write.begin() as session:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        lifecycle.set_trial_status(session=session, trial=trial, status=TrialStatus.succeeded)
        report_store.add_line_reports(
            budget=ample_budget(),
            session=session,
            trial=trial,
            reports=[Incoming(step=9, samples=None, metrics={"val_loss": 0.2})],
            read_to=300,
        )

    trial = the_trial(sessions, trial_id)
    assert (trial.status, trial.step, trial.objective) == (TrialStatus.succeeded, 9, 0.2)


def test_what_one_trial_does_is_the_median_of_those_that_ended_else_the_most_so_far(
    sessions: Sessions, tmp_path: Path
) -> None:
    with sessions.write.begin() as session:
        sweep = stored_sweep(session, tmp_path, 5)
        trials = trial_store.list_trials(session=session, sweep_id=sweep.id)[0]
        assert report_store.work_per_trial(session=session, sweep_id=sweep.id) is None

        def reported(trial: Trial, *samples: float) -> None:
            trial.status, trial.started_at = TrialStatus.running, utcnow()
            session.add_all(
                TrialReport(
                    trial_id=trial.id, attempt=1, kind="line", at=utcnow(), samples=s, metrics={}
                )
                for s in samples
            )
            session.flush()

        reported(trials[0], 100.0, 200.0)
        reported(trials[1], 500.0)
        # Running: what one does is at least what the furthest did so far.
        assert report_store.work_per_trial(session=session, sweep_id=sweep.id) == 500.0
        # Absurd sizes stored before reports were bounded: each counts as the most one may hold.
        reported(trials[2], 1e308, 1e308)
        assert report_store.work_per_trial(session=session, sweep_id=sweep.id) == 2 * MAX_SAMPLES
        for trial, samples in zip(trials[3:], (800.0, 1000.0), strict=True):
            reported(trial, samples)
            trial.status = TrialStatus.succeeded
        trials[0].status = TrialStatus.succeeded
        session.flush()
        # Ended: their median (300, 800 and 1000), whatever the running ones reported.
        assert report_store.work_per_trial(session=session, sweep_id=sweep.id) == 800.0
        # A pruned one counts: what the sweep's trials typically do (300, 500, 800 and 1000).
        trials[1].status = TrialStatus.pruned
        session.flush()
        assert report_store.work_per_trial(session=session, sweep_id=sweep.id) == 650.0
        steps = report_store.work_per_trial(session=session, sweep_id=sweep.id, counted="steps")
        assert steps is None, "no trial counted steps"


def test_a_device_computed_from_each_trials_first_report_of_its_attempt_to_its_end(
    sessions: Sessions, tmp_path: Path
) -> None:
    now = utcnow()

    def at(seconds: float) -> datetime:
        return now + timedelta(seconds=seconds)

    with sessions.write.begin() as session:
        here, there = joined_nodes(session, "here", "there")
        sweep = stored_sweep(session, tmp_path, 6)
        trials = trial_store.list_trials(session=session, sweep_id=sweep.id)[0]

        def ran(
            trial: Trial,
            device: str,
            *reports: tuple[int, float],
            attempt: int = 1,
            node: int | None = None,
        ) -> None:
            trial.status, trial.started_at = TrialStatus.running, at(-20)
            trial.device, trial.attempt = device, attempt
            trial.node_id = here if node is None else node
            session.add_all(
                TrialReport(
                    trial_id=trial.id, attempt=a, kind="line", at=at(s), samples=8.0, metrics={}
                )
                for a, s in reports
            )

        ended, retried, starting, elsewhere, long_ago, other_node = trials
        ran(ended, "GPU-a", (1, 1), (1, 3))
        # A line of metrics alone, as it starts up, is not computing.
        session.add(TrialReport(trial_id=ended.id, attempt=1, kind="line", at=at(0), metrics={}))
        ended.status, ended.ended_at = TrialStatus.succeeded, at(5)
        # Its first attempt's report is another process's. Written before nodes existed, it
        # counts on every node.
        ran(retried, "GPU-a", (1, 0), (2, 4), attempt=2)
        retried.node_id = None
        ran(starting, "GPU-a")
        ran(elsewhere, "GPU-b", (1, 2))
        ran(long_ago, "GPU-a", (1, -15))
        long_ago.status, long_ago.ended_at = TrialStatus.succeeded, at(-10)
        # Another node's GPU of the same key, on a database the nodes share.
        ran(other_node, "GPU-a", (1, 2), node=there)
        session.flush()

        def spans_by(
            end: float, node_id: int | None = here
        ) -> list[tuple[datetime, datetime | None]]:
            spans = report_store.computing_spans(
                session=session, device="GPU-a", since=now, end=at(end), node_id=node_id
            )
            return sorted(spans, key=lambda span: span[0])

        spans, before, anywhere = spans_by(9), spans_by(2), spans_by(9, node_id=None)
    assert spans == [(at(1), at(5)), (at(4), None)]
    assert before == [(at(1), at(5))], "a trial computes from its first report by the end"
    assert anywhere == [(at(1), at(5)), (at(2), None), (at(4), None)], "no node: every node's"
