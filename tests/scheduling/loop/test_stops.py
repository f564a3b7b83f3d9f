"""Stops: a cancel, a trial deaf to SIGTERM, a time limit, a graceful stop, a lapsed lease; and the
reason a stop is recorded with."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from gpumux.config import Settings
from gpumux.processes import rundir
from gpumux.status import SweepStatus, TrialStatus
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Trial

from .support import (
    FIXTURES,
    Harness,
    until,
    wait_for_file,
    wait_gone,
)


def test_cancel_kills_trials_and_their_grandchildren(harness: Harness, tmp_path: Path) -> None:
    pidfiles = [tmp_path / f"pids-{i}" for i in range(2)]
    sweep_id = harness.submit(
        "n=0,1,2",
        command=[sys.executable, str(FIXTURES / "sleeper.py"), str(tmp_path / "pids-{n}")],
        split=2,
    )

    async def scenario() -> list[int]:
        stop = asyncio.Event()
        task = asyncio.create_task(harness.scheduler.run(stop))
        await until(lambda: all(p.exists() for p in pidfiles), "both trials to start")
        pids = [int(pid) for p in pidfiles for pid in p.read_text().split()]
        harness.cancel(sweep_id)
        await until(lambda: harness.sweep_status(sweep_id) == SweepStatus.cancelled, "cancel")
        stop.set()
        await task
        return pids

    pids = asyncio.run(scenario())
    statuses = [t.status for t in harness.trials(sweep_id)]
    assert statuses == [TrialStatus.cancelled] * 3
    assert not (tmp_path / "pids-2").exists(), "the queued trial must never start"
    assert wait_gone(pids) == []


def test_a_trial_that_ignores_sigterm_is_killed_after_the_grace_period(
    harness: Harness, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pids"
    sweep_id = harness.submit(
        command=[sys.executable, str(FIXTURES / "sleeper.py"), str(pidfile), "--ignore-term"]
    )

    async def scenario() -> float:
        stop = asyncio.Event()
        task = asyncio.create_task(harness.scheduler.run(stop))
        await until(pidfile.exists, "the trial to start")
        harness.cancel(sweep_id)
        cancelled_at = time.monotonic()
        await until(lambda: harness.sweep_status(sweep_id) == SweepStatus.cancelled, "cancel")
        stop.set()
        await task
        return time.monotonic() - cancelled_at

    asyncio.run(scenario())
    (trial,) = harness.trials(sweep_id)
    assert trial.status == TrialStatus.cancelled
    assert trial.signal == signal.SIGKILL, "SIGTERM was ignored: only SIGKILL ends it"


def test_a_trial_past_its_time_limit_fails(harness: Harness, tmp_path: Path) -> None:
    sweep_id = harness.submit(
        command=[sys.executable, str(FIXTURES / "sleeper.py"), str(tmp_path / "pids")],
        time_limit_s=0.5,
    )
    asyncio.run(harness.scheduler.run_until_idle())
    (trial,) = harness.trials(sweep_id)
    assert trial.status == TrialStatus.failed
    assert trial.error == "time limit of 0.5 s exceeded; stopped"
    assert trial.signal == signal.SIGTERM


def test_a_graceful_stop_requeues_running_trials_for_the_next_daemon(
    harness: Harness, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pids"
    sweep_id = harness.submit(command=[sys.executable, str(FIXTURES / "sleeper.py"), str(pidfile)])

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(harness.scheduler.run(stop))
        await until(pidfile.exists, "the trial to start")
        stop.set()
        await task
        await harness.scheduler.drain(stop_trials=True)

    asyncio.run(scenario())
    (trial,) = harness.trials(sweep_id)
    assert trial.status == TrialStatus.queued and trial.attempt == 2
    assert trial.error == "attempt 1 stopped by a daemon shutdown; requeued"
    assert wait_gone([int(pid) for pid in pidfile.read_text().split()]) == []


def test_why_gpumux_stopped_a_trial_outlives_the_daemon_that_stopped_it(
    settings: Settings, sessions: Sessions, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pids"
    first = Harness(settings, sessions, tmp_path)
    # Deaf to SIGTERM: it outlives the grace period, in which this daemon goes away.
    sleeper = [sys.executable, str(FIXTURES / "sleeper.py"), str(pidfile), "--ignore-term"]
    sweep_id = first.submit(command=sleeper, time_limit_s=1.0)

    async def stop_then_leave() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(first.scheduler.run(stop))
        await until(
            lambda: any(e.stop is not None for _, e in first.scheduler.watched.items()),
            "the time limit to stop the trial",
        )
        stop.set()
        await task
        await first.scheduler.drain(stop_trials=False)

    asyncio.run(stop_then_leave())
    run_dir = settings.layout.runs / "1.1"
    wait_for_file(run_dir / "exit.json", "the supervisor did not kill the trial")

    second = Harness(settings, sessions, tmp_path)
    second.scheduler.reconcile()
    (trial,) = second.trials(sweep_id)
    assert (trial.status, trial.signal) == (TrialStatus.failed, signal.SIGKILL)
    assert trial.error == "time limit of 1 s exceeded; stopped"


def test_a_trial_its_supervisor_stopped_for_a_lapsed_lease_is_requeued_not_failed(
    harness: Harness, settings: Settings, tmp_path: Path
) -> None:
    # The node's renewals came late (a loaded machine): its supervisors stopped the trial as
    # the lease ran out, while the database still held it for this node.
    pidfile = tmp_path / "pids"
    sweep_id = harness.submit(
        command=[sys.executable, str(FIXTURES / "sleeper.py"), str(pidfile)], split=1
    )

    async def scenario() -> Trial:
        stop = asyncio.Event()
        task = asyncio.create_task(harness.scheduler.run(stop))
        await until(pidfile.exists, "the trial to start")
        (first,) = harness.trials(sweep_id)
        run_dir = settings.layout.runs / f"{first.id}.{first.attempt}"
        # What the supervisor's fence does: record why, then kill the group at once.
        (run_dir / rundir.STOP_REASON).write_text(rundir.LEASE_LAPSED)
        os.killpg(int(pidfile.read_text().split()[0]), signal.SIGKILL)
        await until(lambda: harness.trials(sweep_id)[0].attempt == 2, "the trial's requeue")
        harness.cancel(sweep_id)
        await until(lambda: harness.sweep_status(sweep_id) == SweepStatus.cancelled, "cancel")
        stop.set()
        await task
        return harness.trials(sweep_id)[0]

    trial = asyncio.run(scenario())
    assert trial.attempt == 2 and trial.failures == 0
    assert trial.status is TrialStatus.cancelled
