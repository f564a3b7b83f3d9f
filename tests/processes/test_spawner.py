"""The spawner: supervisors forked on request, that outlive it, and what happens when it dies."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_supervised import OPTIONS, launch_spec, wait_exited

from gpumux.processes.procfs import start_ticks
from gpumux.processes.spawner_client import Spawner
from gpumux.processes.supervised import SupervisedTrial

TIMEOUT_S = 60.0


@pytest.fixture
def spawner(tmp_path: Path) -> Iterator[Spawner]:
    started = Spawner(runs_dir=tmp_path / "runs")
    started.start()
    yield started
    started.close(kill=True)


def wait_until_gone(pid: int, started: int | None) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while start_ticks(pid, living=True) == started:
        assert time.monotonic() < deadline, f"pid {pid} did not exit"
        time.sleep(0.02)


def test_a_forked_supervisor_runs_the_trial_and_records_its_exit(
    tmp_path: Path, spawner: Spawner
) -> None:
    trial = SupervisedTrial.spawn(
        launch_spec(tmp_path, [sys.executable, "-c", "raise SystemExit(6)"]),
        run_dir=tmp_path / "runs" / "3.1",
        options=OPTIONS,
        spawner=spawner,
    )
    assert not trial.child  # forked by the spawner, watched by its pidfd
    wait_exited(trial)
    end = trial.finish()
    assert end is not None and (end.exit_status.exit_code, end.error) == (6, None)
    assert trial.leader is not None and trial.leader[0] != trial.pid
    assert (tmp_path / "logs" / "trial.log").read_text().startswith("gpumux: trial 3 attempt 1")


def test_a_forked_supervisor_outlives_the_spawner_and_keeps_the_exit_status(
    tmp_path: Path, spawner: Spawner
) -> None:
    release = tmp_path / "release"
    script = f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.01)\n"
    trial = SupervisedTrial.spawn(
        launch_spec(tmp_path, [sys.executable, "-c", script + "raise SystemExit(4)"]),
        run_dir=tmp_path / "runs" / "3.1",
        options=OPTIONS,
        spawner=spawner,
    )
    assert spawner.process is not None
    spawner_pid = spawner.process.pid
    spawner.close(kill=True)
    assert start_ticks(spawner_pid) is None
    assert start_ticks(trial.pid, living=True) == trial.started and not trial.exited()

    release.touch()
    wait_exited(trial)
    end = trial.finish()
    assert end is not None and end.exit_status.exit_code == 4


def test_a_dead_spawner_is_replaced_and_the_launch_starts_its_supervisor_directly(
    tmp_path: Path, spawner: Spawner, caplog: pytest.LogCaptureFixture
) -> None:
    assert spawner.process is not None
    dead = spawner.process.pid
    os.kill(dead, signal.SIGKILL)
    with caplog.at_level(logging.WARNING):
        direct = SupervisedTrial.spawn(
            launch_spec(tmp_path, ["true"]),
            run_dir=tmp_path / "runs" / "3.1",
            options=OPTIONS,
            spawner=spawner,
        )
    assert direct.child  # started afresh, as without a spawner
    assert f"spawner: pid {dead} did not answer" in caplog.text
    assert spawner.process is not None and spawner.process.pid != dead

    forked = SupervisedTrial.spawn(
        launch_spec(tmp_path, ["true"], attempt=2),
        run_dir=tmp_path / "runs" / "3.2",
        options=OPTIONS,
        spawner=spawner,
    )
    assert not forked.child  # the new spawner forked it
    for trial in (direct, forked):
        wait_exited(trial)
        end = trial.finish()
        assert end is not None and end.exit_status.exit_code == 0


def test_a_supervisor_forked_before_the_spawner_died_never_runs_its_trial(
    tmp_path: Path, spawner: Spawner
) -> None:
    # The spawner forks, then dies before it answers: that supervisor must exit unrecorded
    # and without running anything, while the launch starts another that runs the trial once.
    marker = tmp_path / "ran"
    assert spawner.process is not None
    old_pid = spawner.process.pid
    fork = spawner.fork
    orphans: list[tuple[int, int | None]] = []

    def fork_then_die(run_dir: Path, go_read: int, own_log: int) -> int | None:
        pid = fork(run_dir, go_read, own_log)
        assert pid is not None
        os.kill(old_pid, signal.SIGKILL)
        orphans.append((pid, start_ticks(pid)))
        return fork(run_dir, go_read, own_log)

    spawner.fork = fork_then_die  # type: ignore[method-assign]
    argv = [sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x')"]
    trial = SupervisedTrial.spawn(
        launch_spec(tmp_path, argv),
        run_dir=tmp_path / "runs" / "3.1",
        options=OPTIONS,
        spawner=spawner,
    )
    assert trial.child
    wait_exited(trial)
    assert trial.finish() is not None
    for pid, started in orphans:
        wait_until_gone(pid, started)
    assert marker.read_text() == "x"


def fork_refused(spawner: Spawner, run_dir: Path) -> bool:
    """Whether the spawner refuses to fork a supervisor for `run_dir` (the caller starts it)."""
    read_end, write_end = os.pipe()
    try:
        return spawner.fork(run_dir, read_end, write_end) is None
    finally:
        os.close(read_end)
        os.close(write_end)


@pytest.mark.parametrize("name", ["..", ".", "link/3.1", "../runs-not/3.1"])
def test_the_spawner_refuses_a_directory_outside_its_runs_directory(
    tmp_path: Path, spawner: Spawner, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "link").symlink_to(tmp_path / "elsewhere")
    assert spawner.process is not None
    pid = spawner.process.pid

    with caplog.at_level(logging.WARNING):
        assert fork_refused(spawner, tmp_path / "runs" / name)
    assert "is not a run directory of" in caplog.text
    # It could not fork this one, and is still the spawner of the next.
    assert spawner.process is not None and spawner.process.pid == pid
    assert not fork_refused(spawner, tmp_path / "runs" / "3.1")


def test_a_launch_the_spawner_cannot_fork_starts_its_supervisor_directly(
    tmp_path: Path, spawner: Spawner
) -> None:
    # The spawner answers FAILED for a run directory not in its runs directory, as for a fork
    # that failed (EAGAIN at the process limit): the trial runs all the same, once.
    trial = SupervisedTrial.spawn(
        launch_spec(tmp_path, [sys.executable, "-c", "print('ran'); raise SystemExit(6)"]),
        run_dir=tmp_path / "elsewhere" / "3.1",
        options=OPTIONS,
        spawner=spawner,
    )
    wait_exited(trial)
    end = trial.finish()
    assert end is not None and end.exit_status.exit_code == 6
    assert (tmp_path / "logs" / "trial.log").read_text().count("ran\n") == 1
