"""Supervised trials from the daemon's side: spawn, find again, adopt, stop."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from builders import cpu_trial_env

from gpumux.processes import rundir
from gpumux.processes.contract import LaunchSpec, trial_env
from gpumux.processes.procfs import start_ticks
from gpumux.processes.supervised import LaunchError, SupervisedTrial, SupervisorOptions

OPTIONS = SupervisorOptions(kill_grace=1.0, heartbeat_interval=0.1, log_max_bytes=10**6, log_keep=1)


def launch_spec(tmp_path: Path, argv: list[str], **fields: object) -> LaunchSpec:
    values: dict[str, object] = dict(
        trial_id=3,
        sweep_id=1,
        attempt=1,
        argv=argv,
        workdir=str(tmp_path),
        base_env={"PATH": os.environ["PATH"], "GPUMUX_TRIAL_ID": "forged", "HOME": "/h"},
        params={"lr": 0.1},
        url="http://127.0.0.1:9",
        token="secret",
        log_path=tmp_path / "logs" / "trial.log",
        device_kind="cpu",
        split=2,
        device_env=cpu_trial_env(1),
    )
    values.update(fields)
    return LaunchSpec(**values)  # type: ignore[arg-type]


def wait_exited(trial: SupervisedTrial) -> None:
    deadline = time.monotonic() + 60
    while not trial.exited():
        assert time.monotonic() < deadline, "the supervisor did not exit"
        time.sleep(0.02)


def test_the_contract_replaces_what_the_submitter_set(tmp_path: Path) -> None:
    env = trial_env(launch_spec(tmp_path, ["true"]))
    assert env["GPUMUX_TRIAL_ID"] == "3" and env["HOME"] == "/h"
    assert env["OMP_NUM_THREADS"] == "1" and env["GPUMUX_SPLIT"] == "2"


def test_a_spawned_trial_ends_with_its_status_and_its_leader_is_known(tmp_path: Path) -> None:
    trial = SupervisedTrial.spawn(
        launch_spec(tmp_path, [sys.executable, "-c", "raise SystemExit(6)"]),
        run_dir=tmp_path / "run",
        options=OPTIONS,
    )
    wait_exited(trial)
    end = trial.finish()
    assert end is not None and (end.exit_status.exit_code, end.error) == (6, None)
    assert trial.leader is not None and trial.leader[0] != trial.pid
    assert (tmp_path / "logs" / "trial.log").read_text().startswith("gpumux: trial 3 attempt 1")


def test_an_attempt_whose_run_directory_exists_is_not_started_twice(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    with pytest.raises(LaunchError, match="cannot start the trial's supervisor"):
        SupervisedTrial.spawn(
            launch_spec(tmp_path, ["true"]), run_dir=tmp_path / "run", options=OPTIONS
        )


def test_a_supervisor_that_cannot_be_recorded_runs_nothing_and_is_collected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(run_dir: Path, **record: object) -> None:
        raise OSError(28, "No space left on device")

    # The record of the supervisor's pid is what a full disk refuses here.
    monkeypatch.setattr(rundir, "record_supervisor", disk_full)
    marker = tmp_path / "ran"
    children_before = children()
    with pytest.raises(LaunchError, match="cannot record the trial's supervisor .* No space left"):
        SupervisedTrial.spawn(
            launch_spec(tmp_path, ["touch", str(marker)]), run_dir=tmp_path / "run", options=OPTIONS
        )
    assert children() == children_before, "the supervisor was collected: no zombie"
    assert (
        "the daemon went away before the start" in (tmp_path / "run" / "supervisor.log").read_text()
    )
    assert not marker.exists()


def children() -> set[int]:
    """This process's children, zombies included (from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == os.getpid():
                found.add(int(entry.name))
    return found


def test_a_running_supervisor_is_found_again_from_its_run_directory(tmp_path: Path) -> None:
    first = SupervisedTrial.spawn(
        launch_spec(tmp_path, [sys.executable, "-c", "import time; time.sleep(600)"]),
        run_dir=tmp_path / "run",
        options=OPTIONS,
    )
    found = SupervisedTrial.find(trial_id=3, attempt=1, run_dir=tmp_path / "run")
    assert found is not None and (found.pid, found.started) == (first.pid, first.started)
    found.terminate()
    wait_exited(first)
    end = first.finish()
    assert end is not None and end.exit_status.signal == signal.SIGTERM
    found.close()
    assert SupervisedTrial.find(trial_id=3, attempt=1, run_dir=tmp_path / "run") is None


def test_a_pid_reused_by_another_process_is_not_adopted(tmp_path: Path) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        started = start_ticks(other.pid)
        assert started is not None
        adopted = SupervisedTrial.adopt(
            trial_id=1, attempt=1, run_dir=tmp_path, pid=other.pid, started=started - 1
        )
        assert adopted is None
    finally:
        other.kill()
        other.wait()


def test_a_zombie_is_not_adopted(tmp_path: Path) -> None:
    zombie = subprocess.Popen(["true"])
    os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)
    started = start_ticks(zombie.pid)
    assert started is not None and start_ticks(zombie.pid, living=True) is None
    assert (
        SupervisedTrial.adopt(
            trial_id=1, attempt=1, run_dir=tmp_path, pid=zombie.pid, started=started
        )
        is None
    )
    zombie.wait()


def test_records_from_another_boot_name_no_process(tmp_path: Path) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        started = start_ticks(sleeper.pid)
        record = {"pid": sleeper.pid, "started": started, "boot": "another-boot"}
        (tmp_path / rundir.SUPERVISOR_RECORD).write_text(json.dumps(record))
        assert SupervisedTrial.find(trial_id=1, attempt=1, run_dir=tmp_path) is None
        record["boot"] = rundir.boot_id()
        (tmp_path / rundir.SUPERVISOR_RECORD).write_text(json.dumps(record))
        found = SupervisedTrial.find(trial_id=1, attempt=1, run_dir=tmp_path)
        assert found is not None and found.pid == sleeper.pid
        found.close()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_line_break_in_a_command_starts_no_line_of_the_daemons_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    forged = "x\n2026-01-01 00:00:00 CRITICAL forged"
    with caplog.at_level(logging.INFO, logger="gpumux.processes.supervised"):
        trial = SupervisedTrial.spawn(
            launch_spec(tmp_path, [sys.executable, "-c", "pass", forged]),
            run_dir=tmp_path / "run",
            options=OPTIONS,
        )
    wait_exited(trial)
    trial.finish()
    [launched] = [r.getMessage() for r in caplog.records if "supervisor pid" in r.getMessage()]
    assert "\n" not in launched and "CRITICAL forged" in launched
