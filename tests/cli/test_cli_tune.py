"""`gpumux tune` as a user runs it: real trial processes on a daemon of its own; GPU choice."""

from __future__ import annotations

import os
import re
import signal
import struct
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from builders import terminal_signals
from scripted_nvml import H100_NAME, scripted_nvml

from gpumux.cli.rounds import (
    Round,
    best_split,
    choose_unit,
    measure_round,
    results_table,
)
from gpumux.cli.state import CliError
from gpumux.cli.tune import choose_gpu
from gpumux.schemas.trials import TrialPublic
from gpumux.status import TrialStatus
from gpumux.throughput import SAMPLES_PER_S, TRIALS_PER_S

FIXTURES = Path(__file__).parents[1] / "fixtures"
REPORT_SAMPLES = str(FIXTURES / "report_samples.py")
CRASH = str(FIXTURES / "crash.py")
DEADLINE_S = 60.0
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
T0 = datetime(2025, 1, 1, tzinfo=UTC)
# Marks that it started (its pid in the file named by argv[1]), then runs until a signal.
STARTED_THEN_BLOCK = (
    "import os, pathlib, signal, sys; "
    "pathlib.Path(sys.argv[1]).write_text(str(os.getpid())); signal.pause()"
)


def tune_env(tmp_path: Path, short_tmp_path: Path) -> dict[str, str]:
    """A user whose gpumux data would live in tmp_path/home, temporary files in short_tmp_path:
    tune's socket lives there, and a Unix socket's path (107 bytes at most) below tmp_path is
    too long under pytest-xdist (its worker's directory lengthens tmp_path)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("GPUMUX_")}
    # Wide, so that table rows stay on one line each in what the tests read.
    env.update(
        GPUMUX_HOME=str(tmp_path / "home"),
        GPUMUX_KILL_GRACE="5",
        TMPDIR=str(short_tmp_path),
        COLUMNS="200",
    )
    return env


def tune(
    *args: str, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpumux", "tune", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )


def row(output: str, pattern: str) -> re.Match[str] | None:
    """The table row matching `pattern` (cells separated by │)."""
    return re.search(pattern, output, re.MULTILINE)


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's header; AssertionError when it is not a PNG."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_tune_measures_each_split_and_draws_the_curve(tmp_path: Path, short_tmp_path: Path) -> None:
    # The user's own database, named by URL: tune measures on a fresh one of its own instead.
    env = {
        **tune_env(tmp_path, short_tmp_path),
        "GPUMUX_DATABASE_URL": f"sqlite:///{tmp_path / 'mine.db'}",
    }
    png = tmp_path / "curve.png"
    result = tune(
        "--splits", "2,1", "--png", str(png), "--", sys.executable, REPORT_SAMPLES,
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "N=1: 1/1 succeeded" in out
    assert "N=2: 2/2 succeeded" in out
    assert "4,000 samples reported" in out and "8,000 samples reported" in out
    assert re.search(r"┃ +N ┃ succeeded ┃ round ┃ samples/s ┃ speed-up ┃ s/trial ┃", out), out
    one = row(out, r"^│ +1 │ +1/1 │ +[\d.]+s │ +([\d,.]+) │ +1\.00x │ +[\d.]+s │")
    two = row(out, r"^│ +2 │ +2/2 │ +[\d.]+s │ +([\d,.]+) │ +(\d+\.\d\d)x │ +[\d.]+s │")
    assert one is not None and two is not None, out
    assert float(one.group(1).replace(",", "")) > 0
    assert float(two.group(2)) > 0
    best = re.search(r"^best: N=(\d) on ", out, re.MULTILINE)
    assert best is not None and best.group(1) in ("1", "2")
    # The chart: its header, a bar per N, the best one marked.
    assert re.search(r"^ *N aggregate samples/s +seconds per trial", out, re.MULTILINE), out
    assert re.search(rf"^{best.group(1)} █+.* ◀ best$", out, re.MULTILINE), out
    assert png_size(png)[0] > 0
    assert f"wrote {png}" in " ".join(result.stderr.split())
    # A private daemon on a temporary directory: the user's data is untouched, nothing left over.
    assert not (tmp_path / "home").exists() and not (tmp_path / "mine.db").exists()
    assert list(Path(env["TMPDIR"]).iterdir()) == []


def test_a_failing_command_is_reported_per_split(tmp_path: Path, short_tmp_path: Path) -> None:
    env = tune_env(tmp_path, short_tmp_path)
    result = tune(
        "--splits", "1,2", "--keep", "--", sys.executable, CRASH, "--code=3", env=env
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    out = result.stdout
    assert "N=1: 0/1 succeeded" in out
    assert "N=2: 0/2 succeeded" in out
    assert out.count("exited with code 3: crash: giving up with code 3") == 3
    assert row(out, r"^│ +1 │ +0/1 │ .* │ +- │ +- │ +- │ failed │$"), out
    assert row(out, r"^│ +2 │ +0/2 │ .* │ +- │ +- │ +- │ failed │$"), out
    assert "aggregate" not in out and "best" not in out
    assert "no N succeeded" in result.stderr
    kept = re.search(r"kept (\S+): the database and the trials' logs", result.stderr)
    assert kept is not None, result.stderr
    data = Path(kept.group(1))
    assert data.parent == Path(env["TMPDIR"])
    assert (data / "gpumux.db").is_file()
    assert len(list((data / "logs").glob("sweep-*/*"))) == 3
    assert not (tmp_path / "home").exists()


def test_ctrl_c_stops_the_trials_and_removes_the_data_directory(
    tmp_path: Path, short_tmp_path: Path
) -> None:
    env = tune_env(tmp_path, short_tmp_path)
    started = tmp_path / "started"
    command = [sys.executable, "-c", STARTED_THEN_BLOCK, str(started)]
    tuner = subprocess.Popen(
        [sys.executable, "-m", "gpumux", "tune", "--splits", "1,2", "--", *command],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=terminal_signals,
    )
    deadline = time.monotonic() + DEADLINE_S
    while not (started.exists() and started.read_text()):
        assert tuner.poll() is None, tuner.communicate()
        assert time.monotonic() < deadline, "the trial never started"
        time.sleep(0.05)
    trial_pid = int(started.read_text())
    tuner.send_signal(signal.SIGINT)
    out, errors = tuner.communicate(timeout=DEADLINE_S)
    assert tuner.returncode == 130, errors
    assert "interrupted: stopping the trials" in errors
    assert "N=1:" not in out
    with pytest.raises(ProcessLookupError):
        os.kill(trial_pid, 0)
    assert list(Path(env["TMPDIR"]).iterdir()) == []
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["python", "train.py"], "put -- before the command: gpumux tune -- python train.py"),
        ([], "no command: write gpumux tune [OPTIONS] -- COMMAND"),
        (["--splits", "1,two", "--", "true"], "--splits 1,two: expected numbers"),
        (["--splits", "0", "--", "true"], "--splits: N=0 is not between 1 and 64"),
        (["--splits", "1", "--", "python", "t.py", "{lr}"], "{lr} names no parameter"),
    ],
)
def test_usage_errors_run_nothing(
    tmp_path: Path, short_tmp_path: Path, args: list[str], message: str
) -> None:
    env = tune_env(tmp_path, short_tmp_path)
    result = tune(*args, env=env)
    assert result.returncode == 2
    assert message in " ".join(result.stderr.split())
    assert "starting a daemon" not in result.stdout + result.stderr
    assert list(Path(env["TMPDIR"]).iterdir()) == []


def test_an_environment_variable_that_is_not_utf8_is_refused_by_name(
    tmp_path: Path, short_tmp_path: Path
) -> None:
    env = tune_env(tmp_path, short_tmp_path)
    env["GARBLED"] = os.fsdecode(b"x\xff")
    result = tune("--splits", "1", "--", "true", env=env)
    assert result.returncode == 2
    assert "the environment variable GARBLED is not valid UTF-8" in result.stderr
    assert list(Path(env["TMPDIR"]).iterdir()) == []


def test_the_first_visible_gpu_is_measured_by_default() -> None:
    nvml = scripted_nvml("two_gpus")
    first, second = (gpu.uuid for gpu in nvml.gpus)
    assert choose_gpu(None, visible=None, nvml=nvml) == first
    assert choose_gpu(None, visible="1", nvml=nvml) == second
    assert choose_gpu(None, visible="", nvml=nvml) is None


def test_gpu_chooses_one_gpu_by_index_or_uuid() -> None:
    nvml = scripted_nvml("two_gpus")
    second = nvml.gpus[1].uuid
    assert choose_gpu("1", visible="0", nvml=nvml) == second
    assert choose_gpu(second, visible=None, nvml=nvml) == second
    for wrong in ("5", "0,1", "GPU-"):
        with pytest.raises(CliError, match=rf"--gpu {wrong}: expected the index or UUID") as error:
            choose_gpu(wrong, visible=None, nvml=nvml)
        assert error.value.exit_code == 2
        assert f"1 ({second}, {H100_NAME})" in str(error.value)


@pytest.mark.parametrize("scenario", ["no_library", "no_gpus"])
def test_without_a_gpu_the_cpu_is_measured(scenario: str) -> None:
    nvml = scripted_nvml(scenario)
    assert choose_gpu(None, visible=None, nvml=nvml) is None
    assert choose_gpu("0", visible=None, nvml=nvml) is None


def ended_trial(
    trial_id: int, status: TrialStatus, start_s: float, end_s: float, error: str | None = None
) -> TrialPublic:
    """A trial that ran from T0 + start_s to T0 + end_s and ended in `status`."""
    return TrialPublic(
        id=trial_id, sweep_id=1, number=trial_id, params={}, status=status, attempt=1,
        device="cpu", slot=0, split=2, memory_limit_mb=None, cpu_threads=1, pid=None,
        queued_at=T0, started_at=T0 + timedelta(seconds=start_s),
        ended_at=T0 + timedelta(seconds=end_s), exit_code=None, signal=None, error=error,
        objective=None, samples_per_s=None, last_report_at=None,
    )  # fmt: skip


def test_a_round_measures_the_makespan_and_the_median_of_succeeded_trials() -> None:
    trials = [
        ended_trial(1, TrialStatus.succeeded, 0.0, 2.0),
        ended_trial(2, TrialStatus.succeeded, 0.5, 4.5),
        ended_trial(3, TrialStatus.succeeded, 1.0, 4.0),
        ended_trial(4, TrialStatus.failed, 1.0, 5.0, "exited with code 3\nTraceback\nboom"),
    ]
    measured = measure_round(4, trials, {1: 100.0, 2: 200.0, 4: 50.0})
    assert measured.makespan_s == 5.0
    assert measured.seconds_per_trial == 3.0
    assert (measured.trials, measured.succeeded, measured.samples) == (4, 3, 350.0)
    assert measured.errors == ("trial 4 failed: exited with code 3: boom",)
    assert measured.measured
    assert measured.throughput(SAMPLES_PER_S) == 70.0
    assert measured.throughput(TRIALS_PER_S) == 0.6


def test_rounds_without_samples_are_compared_in_trials_per_second() -> None:
    one = Round(split=1, trials=1, succeeded=1, samples=0.0, makespan_s=2.0, seconds_per_trial=2.0)
    two = Round(split=2, trials=2, succeeded=2, samples=0.0, makespan_s=2.0, seconds_per_trial=2.0)
    three = Round(split=3, trials=3, succeeded=3, samples=9.0, makespan_s=3.0, seconds_per_trial=3)
    failed = Round(
        split=5, trials=5, succeeded=0, samples=0.0, makespan_s=1.0, seconds_per_trial=None
    )
    assert choose_unit([three, failed]) == SAMPLES_PER_S
    assert choose_unit([one, two, three, failed]) == TRIALS_PER_S
    # Two and three both finish one trial a second: the smaller N wins the tie.
    assert best_split([one, two, three, failed], TRIALS_PER_S) == 2
    assert best_split([failed], TRIALS_PER_S) is None
    table = results_table([one, two, three, failed], unit=TRIALS_PER_S, best=2)
    cells = {column.header: list(column.cells) for column in table.columns}
    assert cells["trials/s"] == ["0.5", "1", "1", "-"]
    assert cells["speed-up"] == ["1.00x", "2.00x", "2.00x", "-"]
    assert cells["succeeded"] == ["1/1", "2/2", "3/3", "0/5"]
    assert cells[""] == ["", "best", "", "failed"]
    without_baseline = results_table([two, three], unit=TRIALS_PER_S, best=2)
    assert list(without_baseline.columns[4].cells) == ["-", "-"]


def test_tune_measures_the_simulated_gpu_when_one_is_set(
    tmp_path: Path, short_tmp_path: Path
) -> None:
    env = tune_env(tmp_path, short_tmp_path)
    env.update(GPUMUX_SIMULATED_GPU="a100-compute-bound", GPUMUX_SIMULATED_TIME_SCALE="0.05")
    trial = [sys.executable, "-m", "gpumux.devices.simulated.trial", "--epochs=2"]
    # --gpu names no GPU of the simulated daemon: it is ignored, not looked up on the host.
    result = tune("--splits", "1,3", "--gpu", "0", "--", *trial, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "GPUMUX_SIMULATED_GPU is set: --gpu 0 ignored" in result.stderr
    assert "on NVIDIA A100-SXM4-40GB (simulated, time x0.05)" in result.stderr
    # Every epoch of every trial reported its samples (2 of 2,000 each, the model's epoch).
    assert re.search(r"^N=1: 1/1 succeeded, .* 4,000 samples reported", result.stdout, re.M)
    assert re.search(r"^N=3: 3/3 succeeded, .* 12,000 samples reported", result.stdout, re.M)
