"""should_stop(): a script stopped by gpumux's supervisor may checkpoint and end by itself."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from builders import cpu_trial_env

from gpumux.processes.contract import LaunchSpec
from gpumux.processes.rundir import ExitStatus
from gpumux.processes.supervised import SupervisedTrial, SupervisorOptions
from gpumux.runtime import should_stop

from .support import FIXTURES, TIMEOUT_S, run_python, trial_env

# Longer than any test: a trial that ends by itself does so long before SIGKILL could come.
OPTIONS = SupervisorOptions(
    kill_grace=600.0, heartbeat_interval=0.5, log_max_bytes=10**6, log_keep=1
)


def supervised(tmp_path: Path, *args: str) -> SupervisedTrial:
    """stop_when_asked.py as the daemon runs a trial: through its supervisor, the runtime loaded."""
    spec = LaunchSpec(
        trial_id=3,
        sweep_id=1,
        attempt=1,
        argv=[sys.executable, str(FIXTURES / "stop_when_asked.py"), str(tmp_path), *args],
        workdir=str(tmp_path),
        base_env={"PATH": os.environ["PATH"]},
        params={},
        url="http://127.0.0.1:9",
        token="secret",
        log_path=tmp_path / "trial.log",
        device_kind="cpu",
        split=1,
        device_env=cpu_trial_env(1),
    )
    return SupervisedTrial.spawn(spec, run_dir=tmp_path / "run", options=OPTIONS)


def stop_when_ready(trial: SupervisedTrial, ready: Path) -> ExitStatus:
    """Stop the trial as gpumux does once `ready` exists; how it ended."""
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ready.exists():
            assert not trial.exited(), "the trial ended before it was stopped"
            assert time.monotonic() < deadline, f"{ready} never appeared"
            time.sleep(0.02)
        trial.terminate()
        while not trial.exited():
            assert time.monotonic() < deadline, "the trial did not end"
            time.sleep(0.02)
    except AssertionError:
        trial.kill()  # no trial left behind for the long grace period
        trial.finish()
        raise
    end = trial.finish()
    assert end is not None
    return end.exit_status


def test_a_script_that_asks_checkpoints_and_ends_itself(tmp_path: Path) -> None:
    trial = supervised(tmp_path)

    status = stop_when_ready(trial, tmp_path / "ready")

    assert status == ExitStatus(exit_code=0, signal=None), (tmp_path / "trial.log").read_text()
    step = (tmp_path / "checkpoint").read_text()
    assert (
        f"script: stopped at step {step}, checkpoint written"
        in (tmp_path / "trial.log").read_text()
    )


def test_a_script_that_never_asks_is_ended_by_sigterm(tmp_path: Path) -> None:
    trial = supervised(tmp_path, "--never-ask")

    status = stop_when_ready(trial, tmp_path / "ready")

    assert status == ExitStatus(exit_code=None, signal=signal.SIGTERM)
    assert not (tmp_path / "checkpoint").exists()


def test_asked_from_another_thread_first_it_warns_once_and_waits_for_the_main_thread(
    tmp_path: Path,
) -> None:
    result = run_python([str(FIXTURES / "should_stop_threads.py")], trial_env(None), tmp_path)

    assert result.returncode == 0, result.stdout
    lines = result.stdout.splitlines()
    assert lines[0].startswith(
        "gpumux: WARNING: should_stop() was first called from thread 'Thread-1 (<lambda>)': "
        "only the main thread can handle SIGTERM"
    )
    assert lines[1:] == [
        "script: thread [False, False], SIGTERM default True",
        "script: main False",
        "script: after SIGTERM True",
    ]


def test_outside_gpumux_it_is_false_and_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUMUX_TRIAL_ID", raising=False)
    handler = signal.getsignal(signal.SIGTERM)

    assert should_stop() is False
    assert signal.getsignal(signal.SIGTERM) is handler


def test_a_handler_of_the_script_is_replaced_with_a_note(tmp_path: Path) -> None:
    script = (
        "import signal; from gpumux.runtime import should_stop; "
        "signal.signal(signal.SIGTERM, lambda *_: print('script: own handler')); "
        "should_stop(); signal.raise_signal(signal.SIGTERM); print(f'script: {should_stop()}')"
    )

    result = run_python(["-c", script], trial_env(None), tmp_path)

    assert result.returncode == 0, result.stdout
    lines = result.stdout.splitlines()
    assert lines[0].startswith("gpumux: should_stop() replaced this process's SIGTERM handler")
    assert lines[1:] == ["script: True"]
