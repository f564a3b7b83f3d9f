"""Report lines read from running trials' logs: recorded once, even across a daemon restart."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from builders import ample_budget, stored_running_trial

from gpumux.scheduling.lines import READ_LIMIT, LogReports
from gpumux.storage import reports as report_store
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import utcnow


def test_a_restarted_daemon_reads_on_from_the_offset_stored_with_the_reports(
    sessions: Sessions, tmp_path: Path
) -> None:
    log_path = tmp_path / "trial.log"
    first = b'GPUMUX_REPORT {"step": 0, "val_loss": 0.9}\nnoise\n'
    log_path.write_bytes(first)
    with sessions.write.begin() as session:
        trial_id = stored_running_trial(session, tmp_path, log_path=str(log_path))

    LogReports(sessions=sessions, budget=ample_budget()).collect()
    with log_path.open("ab") as log:
        log.write(b'GPUMUX_REPORT {"step": 1, "val_loss": 0.5}\n')
    # A new reader, as a restarted daemon has: it knows only what the database holds.
    LogReports(sessions=sessions, budget=ample_budget()).collect()

    with sessions.read() as session:
        reports, _ = report_store.list_reports(session=session, trial_id=trial_id)
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        assert [report.step for report in reports] == [0, 1], "each line recorded once"
        assert trial.log_scanned == log_path.stat().st_size


def test_an_earlier_attempt_read_to_its_end_is_told_apart_from_the_running_one(
    sessions: Sessions, tmp_path: Path
) -> None:
    log_path = tmp_path / "trial.log"
    log_path.write_bytes(b'GPUMUX_REPORT {"step": 0, "val_loss": 0.9}\n')
    with sessions.write.begin() as session:
        trial_id = stored_running_trial(session, tmp_path, log_path=str(log_path), attempt=2)
    reports = LogReports(sessions=sessions, budget=ample_budget())
    # Attempt 1's supervisor exited (the database already runs attempt 2): nothing left to read.
    reports.ended([(trial_id, 1)])
    assert reports.collect(only={trial_id}) == {(trial_id, 1)}, "not attempt 2, still running"
    reports.ended([(trial_id, 2)])
    assert reports.collect(only={trial_id}) == {(trial_id, 2)}


def test_the_last_pool_a_line_told_stays_on_the_trial_merged_lines_and_all(
    sessions: Sessions, tmp_path: Path
) -> None:
    log_path = tmp_path / "trial.log"
    log_path.write_bytes(
        b'GPUMUX_REPORT {"step": 0, "samples": 10, "pool_mb": 900}\n'
        # Two lines of one step are merged into one report: the later pool is its own.
        b'GPUMUX_REPORT {"step": 1, "samples": 10, "pool_mb": 1500}\n'
        b'GPUMUX_REPORT {"step": 1, "samples": 10, "pool_mb": 2100}\n'
        b'GPUMUX_REPORT {"step": 2, "samples": 10}\n'
    )
    started = utcnow() - timedelta(seconds=30)
    with sessions.write.begin() as session:
        trial_id = stored_running_trial(
            session, tmp_path, log_path=str(log_path), started_at=started
        )

    LogReports(sessions=sessions, budget=ample_budget()).collect()

    with sessions.read() as session:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        reports, _ = report_store.list_reports(session=session, trial_id=trial_id)
        assert trial is not None
        assert [(r.step, r.metrics) for r in reports] == [(0, {}), (1, {}), (2, {})]
        # Printed after the read before (the trial's start) at the earliest.
        assert (trial.pool_mb, trial.pool_at) == (2100, started)


def test_a_pool_printed_after_a_whole_read_counts_as_read_no_earlier_than_that_read(
    sessions: Sessions, tmp_path: Path
) -> None:
    log_path = tmp_path / "trial.log"
    log_path.write_bytes(b'GPUMUX_REPORT {"step": 0, "samples": 10}\n')
    with sessions.write.begin() as session:
        trial_id = stored_running_trial(
            session, tmp_path, log_path=str(log_path), started_at=utcnow() - timedelta(hours=1)
        )
    reports = LogReports(sessions=sessions, budget=ample_budget())
    before = utcnow()
    reports.collect()
    after = utcnow()
    with log_path.open("ab") as log:
        log.write(b'GPUMUX_REPORT {"step": 1, "samples": 10, "pool_mb": 900}\n')
    reports.collect()

    with sessions.read() as session:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None and trial.pool_mb == 900
        # Not before the read that found the log's end without it, nor after it began.
        assert trial.pool_at is not None and before <= trial.pool_at <= after


def test_a_pool_in_a_log_read_behind_counts_as_read_at_the_trials_start(
    sessions: Sessions, tmp_path: Path
) -> None:
    log_path = tmp_path / "trial.log"
    # More than one read's slice: the line after the noise was printed before the first read.
    noise = b"x" * 100 + b"\n"
    log_path.write_bytes(
        b'GPUMUX_REPORT {"step": 0, "samples": 10}\n'
        + noise * (READ_LIMIT // len(noise) + 1)
        + b'GPUMUX_REPORT {"step": 1, "samples": 10, "pool_mb": 900}\n'
    )
    started = utcnow() - timedelta(hours=1)
    with sessions.write.begin() as session:
        trial_id = stored_running_trial(
            session, tmp_path, log_path=str(log_path), started_at=started
        )
    reports = LogReports(sessions=sessions, budget=ample_budget())
    reports.collect()
    assert reports.behind
    reports.collect()

    with sessions.read() as session:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        assert (trial.pool_mb, trial.pool_at) == (900, started)
