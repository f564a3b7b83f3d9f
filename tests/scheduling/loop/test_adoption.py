"""A daemon away and back: what a dead daemon left running is killed or adopted, ends while no
daemon ran are recorded, a stale supervisor is killed."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from gpumux.config import Settings
from gpumux.processes.procfs import start_ticks as process_start_ticks
from gpumux.status import TrialStatus
from gpumux.storage.engine import Sessions

from .support import (
    FIXTURES,
    Harness,
    gone,
    start_then_leave,
    supervisor_pid,
    until,
    wait_for_file,
    wait_gone,
)


def exit_after_flag(flag: Path, code: int) -> list[str]:
    """A trial that waits for `flag` to exist, then exits with `code`."""
    script = (
        "import pathlib, sys, time\n"
        f"flag = pathlib.Path({str(flag)!r})\n"
        "while not flag.exists(): time.sleep(0.02)\n"
        f"sys.exit({code})\n"
    )
    return [sys.executable, "-c", script]


def test_at_start_a_trial_left_running_by_a_dead_daemon_is_killed_and_requeued(
    harness: Harness, tmp_path: Path
) -> None:
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
    )
    sweep_id = harness.submit(command=["true"])
    harness.mark_running(sweep_id, pid=orphan.pid, started=process_start_ticks(orphan.pid))
    harness.scheduler.reconcile()
    assert orphan.wait(timeout=10) == -signal.SIGKILL
    (trial,) = harness.trials(sweep_id)
    assert trial.status == TrialStatus.queued and trial.attempt == 2
    asyncio.run(harness.scheduler.run_until_idle())
    (trial,) = harness.trials(sweep_id)
    assert trial.status == TrialStatus.succeeded and trial.attempt == 2


def test_at_start_the_children_of_a_dead_trial_leader_are_killed(
    harness: Harness, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pids"
    leader = subprocess.Popen(
        [sys.executable, str(FIXTURES / "sleeper.py"), str(pidfile)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
    )
    wait_for_file(pidfile, "the sleeper did not start")
    child = int(pidfile.read_text().split()[1])
    started = process_start_ticks(leader.pid)
    leader.kill()
    leader.wait()
    assert not gone(child), "the child must outlive its leader for this test"
    sweep_id = harness.submit(command=["true"])
    harness.mark_running(sweep_id, pid=leader.pid, started=started)
    harness.scheduler.reconcile()
    assert wait_gone([child]) == []
    (trial,) = harness.trials(sweep_id)
    assert trial.status == TrialStatus.queued and trial.log_path is None


def test_a_graceful_stop_leaves_trials_running_and_the_next_scheduler_adopts_them(
    settings: Settings, sessions: Sessions, tmp_path: Path
) -> None:
    flag = tmp_path / "flag"
    first = Harness(settings, sessions, tmp_path)
    sweep_id = first.submit("x=1,2", command=exit_after_flag(flag, 5), split=2)
    asyncio.run(start_then_leave(first, sweep_id))
    leaders = [t.pid for t in first.trials(sweep_id)]
    assert all(t.status == TrialStatus.running for t in first.trials(sweep_id))
    assert all(pid is not None and not gone(pid) for pid in leaders), "they run on"

    second = Harness(settings, sessions, tmp_path)

    async def adopt_then_release() -> None:
        second.scheduler.reconcile()
        assert second.scheduler.running_count == 2, "both adopted, none requeued"
        flag.touch()
        await second.scheduler.run_until_idle()

    asyncio.run(adopt_then_release())
    trials = second.trials(sweep_id)
    assert [(t.status, t.exit_code, t.attempt) for t in trials] == [
        (TrialStatus.failed, 5, 1),
        (TrialStatus.failed, 5, 1),
    ]


def test_a_trial_that_ends_while_no_daemon_runs_is_recorded_with_its_exit_status(
    settings: Settings, sessions: Sessions, tmp_path: Path
) -> None:
    flag = tmp_path / "flag"
    first = Harness(settings, sessions, tmp_path)
    sweep_id = first.submit(command=exit_after_flag(flag, 0))
    asyncio.run(start_then_leave(first, sweep_id))
    (trial,) = first.trials(sweep_id)
    run_dir = settings.layout.runs / f"{trial.id}.1"
    flag.touch()
    wait_for_file(run_dir / "exit.json", "the supervisor never recorded the exit")

    second = Harness(settings, sessions, tmp_path)
    second.scheduler.reconcile()
    (trial,) = second.trials(sweep_id)
    assert (trial.status, trial.exit_code, trial.attempt) == (TrialStatus.succeeded, 0, 1)


def test_a_supervisor_killed_with_its_daemon_away_leaves_a_lost_trial_that_is_requeued(
    settings: Settings, sessions: Sessions, tmp_path: Path
) -> None:
    first = Harness(settings, sessions, tmp_path)
    pidfile = tmp_path / "pids"
    sweep_id = first.submit(command=[sys.executable, str(FIXTURES / "sleeper.py"), str(pidfile)])
    asyncio.run(start_then_leave(first, sweep_id))
    # Running means its command started; the sleeper records its pids a moment later.
    wait_for_file(pidfile, "the sleeper's pids")
    (trial,) = first.trials(sweep_id)
    supervisor = supervisor_pid(settings, trial)
    os.kill(supervisor, signal.SIGKILL)
    assert wait_gone([supervisor]) == []

    second = Harness(settings, sessions, tmp_path)
    second.scheduler.reconcile()
    assert wait_gone([int(pid) for pid in pidfile.read_text().split()]) == [], "no orphans"
    (trial,) = second.trials(sweep_id)
    assert (trial.status, trial.attempt) == (TrialStatus.queued, 2)
    assert trial.error == "attempt 1 lost its supervisor while the daemon was away; requeued"


def test_a_supervisor_whose_heartbeat_goes_stale_is_killed_and_its_trial_requeued(
    settings: Settings, sessions: Sessions, tmp_path: Path
) -> None:
    settings.heartbeat_interval = 0.1
    settings.heartbeat_timeout = 3.0
    harness = Harness(settings, sessions, tmp_path)
    pidfile = tmp_path / "pids"
    sweep_id = harness.submit(command=[sys.executable, str(FIXTURES / "sleeper.py"), str(pidfile)])

    async def scenario() -> tuple[list[int], str | None]:
        stop = asyncio.Event()
        task = asyncio.create_task(harness.scheduler.run(stop))
        await until(pidfile.exists, "the trial to start")
        first_pids = [int(pid) for pid in pidfile.read_text().split()]
        await until(
            lambda: harness.trials(sweep_id)[0].status is TrialStatus.running, "it to be running"
        )
        (trial,) = harness.trials(sweep_id)
        os.kill(supervisor_pid(settings, trial), signal.SIGSTOP)  # hung: alive, silent
        await until(lambda: harness.trials(sweep_id)[0].attempt == 2, "the trial to be requeued")
        error = harness.trials(sweep_id)[0].error
        stop.set()
        await task
        await harness.scheduler.drain(stop_trials=True)
        return first_pids, error

    first_pids, error = asyncio.run(scenario())
    assert wait_gone(first_pids) == [], "no orphans"
    assert error == "attempt 1 lost its supervisor (killed, or stopped answering); requeued"
