"""The scheduler reaps what ends: a trial's exit code and log, only the current attempt's end, the
report budget of an ended trial."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

from gpumux.config import Settings
from gpumux.processes.rundir import ExitStatus, TrialEnd
from gpumux.processes.supervised import SupervisedTrial
from gpumux.scheduling.lines import READ_LIMIT
from gpumux.scheduling.watched import Running
from gpumux.status import TrialStatus
from gpumux.storage import lifecycle
from gpumux.storage import reports as report_store
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Trial

from .support import (
    DEADLINE,
    FIXTURES,
    Harness,
    start_then_leave,
    wait_for_file,
)


def test_a_crashing_trial_fails_with_its_code_and_log_while_others_finish(harness: Harness) -> None:
    sweep_id = harness.submit(
        "code=0,3", "n=1,2", command=[sys.executable, str(FIXTURES / "crash.py")], split=2
    )
    asyncio.run(harness.scheduler.run_until_idle())
    by_code: dict[int, list[Trial]] = {0: [], 3: []}
    for trial in harness.trials(sweep_id):
        by_code[trial.params["code"]].append(trial)
    assert [t.status for t in by_code[0]] == [TrialStatus.succeeded] * 2
    for crashed in by_code[3]:
        assert crashed.status == TrialStatus.failed and crashed.exit_code == 3
        assert crashed.error is not None
        assert "exited with code 3" in crashed.error
        assert "crash: giving up with code 3" in crashed.error
        assert "crash: line 29" in crashed.error and "crash: line 0\n" not in crashed.error


def test_the_end_of_an_older_attempt_never_overwrites_the_newer_one(
    settings: Settings, sessions: Sessions, tmp_path: Path
) -> None:
    flag = tmp_path / "flag"
    first = Harness(settings, sessions, tmp_path)
    script = (
        "import os, pathlib, sys, time\n"
        f"flag = pathlib.Path({str(flag)!r})\n"
        "while not flag.exists(): time.sleep(0.02)\n"
        "sys.exit(10 + int(os.environ['GPUMUX_ATTEMPT']))\n"
    )
    sweep_id = first.submit(command=[sys.executable, "-c", script])
    asyncio.run(start_then_leave(first, sweep_id))
    with sessions.write.begin() as session:
        (trial,) = trial_store.list_trials(session=session, sweep_id=sweep_id)[0]
        lifecycle.set_trial_status(
            session=session, trial=trial, status=TrialStatus.queued, attempt=2, pid=None
        )
    flag.touch()
    run_dir = settings.layout.runs / "1.1"
    wait_for_file(run_dir / "exit.json", "attempt 1 never ended")

    second = Harness(settings, sessions, tmp_path)
    asyncio.run(second.scheduler.run_until_idle())
    (trial,) = second.trials(sweep_id)
    assert (trial.status, trial.attempt, trial.exit_code) == (TrialStatus.failed, 2, 12)
    assert json.loads((run_dir / "exit.json").read_text())["exit_code"] == 11


def test_the_report_budget_holds_no_allowance_of_an_ended_trial(harness: Harness) -> None:
    work = (
        "import json\n"
        "for step in range(3):\n"
        "    print('GPUMUX_REPORT', json.dumps({'step': step, 'loss': 1 / (step + 1)}), flush=True)"
    )
    sweep_id = harness.submit("x=1..4", command=[sys.executable, "-c", work], split=2)
    asyncio.run(harness.scheduler.run_until_idle())
    trials = harness.trials(sweep_id)
    assert {t.status for t in trials} == {TrialStatus.succeeded}
    with harness.sessions.read() as session:
        counts = [report_store.list_reports(session=session, trial_id=t.id)[1] for t in trials]
    assert counts == [3] * len(trials)
    assert len(harness.scheduler.budget) == 0


def test_an_earlier_attempts_log_read_to_its_end_does_not_end_the_current_attempt(
    harness: Harness, tmp_path: Path
) -> None:
    sweep_id = harness.submit(command=["true"])
    # Attempt 2 runs, with more in its log than one read takes.
    log_path = tmp_path / "attempt-2.log"
    log_path.write_bytes(b"output\n" * (READ_LIMIT // 7 + 1))
    harness.mark_running(sweep_id, pid=os.getpid(), started=None)
    with harness.sessions.write.begin() as session:
        (trial,) = trial_store.list_trials(session=session, sweep_id=sweep_id)[0]
        trial.attempt, trial.log_path = 2, str(log_path)
    # Both attempts' supervisors have exited; attempt 1's log, no longer running here, is whole
    # at once, attempt 2's after a read more.
    process = SupervisedTrial(
        trial_id=trial.id, attempt=2, run_dir=tmp_path / "run", pid=os.getpid(), started=None
    )
    try:
        reaper = harness.scheduler.reaper
        end = TrialEnd(ExitStatus(exit_code=0, signal=None), error=None)
        reaper.ending[trial.id] = (Running(process, sweep_id, None, None), end)
        harness.scheduler.lines.ended([(trial.id, 1)])
        reaper.reap()
        assert trial.id in reaper.ending
        assert [t.status for t in harness.trials(sweep_id)] == [TrialStatus.running]
        deadline = time.monotonic() + DEADLINE
        while trial.id in reaper.ending:
            assert time.monotonic() < deadline, "attempt 2's log never read to its end"
            reaper.reap()
    finally:
        process.close()
    assert [t.status for t in harness.trials(sweep_id)] == [TrialStatus.succeeded]
