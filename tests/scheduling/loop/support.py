"""The loop tests' scheduler over the test database, and waits with a deadline for what it brings
about."""

from __future__ import annotations

import asyncio
import getpass
import json
import time
from collections.abc import Callable
from pathlib import Path

from builders import launched, planned, sweep_in

from gpumux.config import Settings
from gpumux.devices.probes import CpuProbe, DeviceProbe
from gpumux.grammar import sweepspec
from gpumux.scheduling.loop import Scheduler
from gpumux.status import SweepStatus
from gpumux.storage import owners as owner_store
from gpumux.storage import sweeps as sweep_store
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Trial

FIXTURES = Path(__file__).parents[2] / "fixtures"


DEADLINE = 60.0


class Harness:
    """A real scheduler over the test database, with helpers to submit and inspect."""

    def __init__(
        self,
        settings: Settings,
        sessions: Sessions,
        tmp_path: Path,
        probe: DeviceProbe | None = None,
    ) -> None:
        self.sessions = sessions
        self.tmp_path = tmp_path
        self.scheduler = Scheduler(
            settings=settings,
            sessions=sessions,
            probe=probe or CpuProbe(),
            url="http://127.0.0.1:9",
        )

    def submit(self, *params: str, command: list[str], **fields: object) -> int:
        sweep = sweep_in(self.tmp_path, *params, command=command, **fields)
        trial_params = sweepspec.expand(
            sweepspec.parse_params(sweep.params), trials=None, seed=1, max_grid=100
        )
        with self.sessions.write.begin() as session:
            owner = owner_store.get_or_create_owner(session=session, name=getpass.getuser())
            return sweep_store.create_sweep(
                session=session, plan=planned(sweep, seed=1, trial_params=trial_params), owner=owner
            ).id

    def trials(self, sweep_id: int) -> list[Trial]:
        with self.sessions.read() as session:
            return trial_store.list_trials(session=session, sweep_id=sweep_id)[0]

    def sweep_status(self, sweep_id: int) -> SweepStatus:
        with self.sessions.read() as session:
            sweep = sweep_store.get_sweep(session=session, sweep_id=sweep_id)
            assert sweep is not None
            return sweep.status

    def mark_running(self, sweep_id: int, *, pid: int, started: int | None) -> None:
        """Record the sweep's first trial as running as `pid`, as a dead daemon leaves it."""
        with self.sessions.write.begin() as session:
            trial = trial_store.list_trials(session=session, sweep_id=sweep_id)[0][0]
            launched(session, trial, running=True, pid=pid, pid_started=started)

    def cancel(self, sweep_id: int) -> None:
        with self.sessions.write.begin() as session:
            sweep = sweep_store.get_sweep(session=session, sweep_id=sweep_id)
            assert sweep is not None
            sweep_store.request_cancel(session=session, sweep=sweep)
        self.scheduler.wake()


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait for a condition that the running scheduler will bring about, with a deadline."""
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def gone(pid: int) -> bool:
    """The process no longer runs (a zombie runs nothing; PID 1 here may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def wait_for_file(path: Path, what: str) -> None:
    """Wait for a file that a process outside the test's control writes, with a deadline."""
    deadline = time.monotonic() + DEADLINE
    while not path.exists():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def supervisor_pid(settings: Settings, trial: Trial) -> int:
    """The pid of the supervisor of the trial's current attempt, as its run directory says."""
    record = json.loads(
        (settings.layout.runs / f"{trial.id}.{trial.attempt}" / "supervisor.json").read_text()
    )
    return int(record["pid"])


def wait_gone(pids: list[int]) -> list[int]:
    """The pids still running once they all ended or 10 s passed (SIGKILL needs a moment)."""
    deadline = time.monotonic() + 10
    while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [pid for pid in pids if not gone(pid)]


async def start_then_leave(harness: Harness, sweep_id: int) -> None:
    """Run the scheduler until the sweep's trials run, then stop it gracefully, leaving them."""
    stop = asyncio.Event()
    task = asyncio.create_task(harness.scheduler.run(stop))
    await until(
        lambda: all(t.pid is not None for t in harness.trials(sweep_id)), "the trials to start"
    )
    stop.set()
    await task
    await harness.scheduler.drain(stop_trials=False)
