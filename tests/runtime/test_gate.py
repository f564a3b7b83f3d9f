"""gpumux tune's gate: a trial launched ahead says it is ready and waits until the gate opens."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpumux.processes import contract
from gpumux.processes.contract import LaunchSpec
from gpumux.runtime.gate import CLOSED, GATE_ENV

from .support import FIXTURES, TIMEOUT_S, ReportServer, trial_env

WAIT_AT_GATE = "from gpumux.runtime import gate; gate.wait_for_turn(); print('computing')"


def wait_ready(trial: subprocess.Popen[str], ready: Path) -> None:
    """Until the trial says it is ready; it failing to, or ending first, fails the test."""
    deadline = time.monotonic() + TIMEOUT_S
    while not ready.exists():
        assert trial.poll() is None, f"the trial ended without saying it was ready: {ready}"
        assert time.monotonic() < deadline, f"the trial never said it was ready: {ready}"
        time.sleep(0.01)


def test_a_trial_says_it_is_ready_and_computes_only_once_the_gate_opens(tmp_path: Path) -> None:
    (tmp_path / CLOSED).touch()
    env = {**os.environ, GATE_ENV: str(tmp_path), "GPUMUX_TRIAL_ID": "7"}
    trial = subprocess.Popen(
        [sys.executable, "-c", WAIT_AT_GATE], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        wait_ready(trial, tmp_path / "7")
        # Ready, it waits while the gate is closed (a wait that can only pass early, never fail
        # on a slow host).
        with pytest.raises(subprocess.TimeoutExpired):
            trial.wait(timeout=0.5)
        (tmp_path / CLOSED).unlink()
        out, _ = trial.communicate(timeout=TIMEOUT_S)
    finally:
        trial.kill()
    assert (trial.returncode, out) == (0, "computing\n")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "done"),
    [
        ([str(Path(__file__).parents[1] / "fixtures" / "torch_loop.py"), "20"], "steps 20"),
        ([str(FIXTURES / "keras_fit.py")], "script: done"),
    ],
    ids=["pytorch-first-step", "keras-fit"],
)
def test_an_unmodified_script_waits_at_the_gate_where_it_begins_to_train(
    report_server: ReportServer, tmp_path: Path, script: list[str], done: str
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / CLOSED).touch()
    env = trial_env(report_server.url, **{GATE_ENV: str(gate)})
    trial = subprocess.Popen(
        [sys.executable, *script], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        # Its training hook said it: the waiting itself is the test above's.
        wait_ready(trial, gate / "7")
        (gate / CLOSED).unlink()
        out, _ = trial.communicate(timeout=TIMEOUT_S)
    finally:
        trial.kill()
    assert trial.returncode == 0, out
    assert any(line.startswith(done) for line in out.splitlines()), out


def test_without_a_gate_a_trial_computes_at_once(tmp_path: Path) -> None:
    env = {name: v for name, v in os.environ.items() if name != GATE_ENV}
    done = subprocess.run(
        [sys.executable, "-c", WAIT_AT_GATE], env=env, capture_output=True, text=True,
        timeout=TIMEOUT_S,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "computing\n")


def test_the_gate_its_submitter_names_reaches_the_trial_where_gpumuxs_own_names_do_not(
    tmp_path: Path,
) -> None:
    spec = LaunchSpec(
        trial_id=3, sweep_id=1, attempt=1, argv=["true"], workdir=str(tmp_path),
        base_env={GATE_ENV: str(tmp_path), "GPUMUX_TRIAL_ID": "99", "GPUMUX_SPLIT": "9"},
        params={}, url="http://127.0.0.1:9", token="secret", log_path=tmp_path / "trial.log",
        device_kind="cpu", split=2, device_env={},
    )  # fmt: skip
    env = contract.trial_env(spec)
    assert (env[GATE_ENV], env["GPUMUX_TRIAL_ID"], env["GPUMUX_SPLIT"]) == (str(tmp_path), "3", "2")
