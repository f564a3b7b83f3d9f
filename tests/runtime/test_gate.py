"""gpumux tune's gate: a trial launched ahead says it is ready and waits until the gate opens."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpumux.cli.overlap import Gate
from gpumux.processes import contract
from gpumux.processes.contract import LaunchSpec
from gpumux.runtime.gate import CLOSED, GATE_ENV
from gpumux.runtime.torch_steps import REPORT_INTERVAL_S

from .support import FIXTURES, TIMEOUT_S, ReportServer, trial_env

WAIT_AT_GATE = "from gpumux.runtime import gate; gate.wait_for_turn(); print('computing')"


def wait_ready(trial: subprocess.Popen[str], ready: Path) -> None:
    """Until the trial says it is ready; it failing to, or ending first, fails the test."""
    deadline = time.monotonic() + TIMEOUT_S
    while not ready.exists():
        assert trial.poll() is None, f"the trial ended without saying it was ready: {ready}"
        assert time.monotonic() < deadline, f"the trial never said it was ready: {ready}"
        time.sleep(0.01)


def waiting_trial(gate: Path) -> subprocess.Popen[str]:
    """A trial at the gate, said ready and seen waiting (a wait that can only pass early,
    never fail, on a slow host)."""
    env = {**os.environ, GATE_ENV: str(gate), "GPUMUX_TRIAL_ID": "7"}
    trial = subprocess.Popen(
        [sys.executable, "-c", WAIT_AT_GATE], env=env, stdout=subprocess.PIPE, text=True
    )
    wait_ready(trial, gate / "7")
    with pytest.raises(subprocess.TimeoutExpired):
        trial.wait(timeout=0.5)
    return trial


def test_a_trial_says_it_is_ready_and_computes_only_once_the_gate_opens(tmp_path: Path) -> None:
    gate = Gate(tmp_path / "gate", closed=True)
    trial = waiting_trial(gate.directory)
    try:
        gate.open()
        out, _ = trial.communicate(timeout=TIMEOUT_S)
    finally:
        trial.kill()
    assert (trial.returncode, out) == (0, "computing\n")


def test_a_trial_goes_on_when_the_tune_holding_its_gate_is_killed(tmp_path: Path) -> None:
    """A tune killed by SIGKILL never opens the gate: its trials must not hold their slices
    of the device for ever."""
    directory = tmp_path / "gate"
    hold = (
        "import sys, time; from pathlib import Path; from gpumux.cli.overlap import Gate; "
        "gate = Gate(Path(sys.argv[1]), closed=True); print('closed', flush=True); time.sleep(600)"
    )
    with subprocess.Popen(
        [sys.executable, "-c", hold, str(directory)], stdout=subprocess.PIPE, text=True
    ) as tune:
        try:
            assert tune.stdout is not None and tune.stdout.readline() == "closed\n"
            trial = waiting_trial(directory)
            try:
                tune.kill()
                out, _ = trial.communicate(timeout=TIMEOUT_S)
            finally:
                trial.kill()
        finally:
            tune.kill()
    assert (trial.returncode, out) == (0, "computing\n")
    assert (directory / CLOSED).exists()


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


@pytest.mark.slow
def test_a_pytorch_trials_rate_leaves_out_its_wait_at_the_gate(
    report_server: ReportServer, tmp_path: Path
) -> None:
    gate = Gate(tmp_path / "gate", closed=True)
    env = trial_env(report_server.url, **{GATE_ENV: str(gate.directory)})
    started = time.monotonic()
    with subprocess.Popen(
        [sys.executable, str(Path(__file__).parents[1] / "fixtures" / "torch_loop.py"), "20"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    ) as trial:  # fmt: skip
        try:
            wait_ready(trial, gate.directory / "7")
            ready = time.monotonic()
            # Held past three report intervals, and past twice its start (on a loaded host,
            # torch's import takes longer than the intervals): the margin the check below needs.
            hold_s = 3 * REPORT_INTERVAL_S + 2 * (ready - started)
            with pytest.raises(subprocess.TimeoutExpired):
                trial.wait(timeout=hold_s)
            opened = time.monotonic()
            gate.open()
            out, _ = trial.communicate(timeout=TIMEOUT_S)
            lived_s = time.monotonic() - started
        finally:
            trial.kill()
    assert trial.returncode == 0, out
    steps = [r for r in report_server.reports if r["kind"] == "steps"]
    assert sum(r["steps"] for r in steps) == 20, steps
    # Its reports' seconds cover its steps and its start since the runtime set up, not the
    # hold it waited ready through: they fit in its life less that hold, however loaded the
    # host. A rate that counted the wait passes it, unless the trial's start before the runtime
    # and its exit took longer than the hold, which is more than twice its whole start.
    waited_s = opened - ready
    assert sum(r["seconds"] for r in steps) <= lived_s - waited_s, (lived_s, waited_s, steps)


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
