"""The preloading spawner: supervisors forked from a process that imported the framework start their
trials without an exec, keep their exit status and outlive it; other commands exec as before."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_supervised import OPTIONS, launch_spec, wait_exited

from gpumux.processes.procfs import start_ticks
from gpumux.processes.spawner_client import Spawner
from gpumux.processes.supervised import SupervisedTrial

FIXTURES = Path(__file__).parents[1] / "fixtures"
PROBE = str(FIXTURES / "preload_probe.py")
# Light, and never imported by a fresh trial's bootstrap: it tells a preloaded start apart.
FRAMEWORK = "numpy"
PRELOADED = "gpumux.runtime.preloaded"
TIMEOUT_S = 60.0


def until_ready(spawner: Spawner) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not spawner.is_ready():
        assert spawner.failed is None, spawner.failed
        assert time.monotonic() < deadline, "the preloading spawner never said it was ready"
        time.sleep(0.02)


@pytest.fixture
def preloading_spawner(tmp_path: Path) -> Iterator[Spawner]:
    spawner = Spawner(runs_dir=tmp_path / "runs", preload=(PRELOADED, FRAMEWORK), preloading=True)
    spawner.start()
    until_ready(spawner)
    yield spawner
    spawner.close(kill=True)


def run(
    tmp_path: Path, argv: list[str], spawner: Spawner, *, preload: bool = True, code: int = 0
) -> SupervisedTrial:
    return SupervisedTrial.spawn(
        launch_spec(tmp_path, argv, preload=preload, params={"code": code}),
        run_dir=tmp_path / "runs" / "3.1",
        options=OPTIONS,
        spawner=spawner,
    )


def reported(tmp_path: Path) -> dict[str, float]:
    lines = (tmp_path / "logs" / "trial.log").read_text().splitlines()
    [line] = [line for line in lines if line.startswith("GPUMUX_REPORT ")]
    return dict(json.loads(line.removeprefix("GPUMUX_REPORT ")))


def exit_code(trial: SupervisedTrial) -> int | None:
    wait_exited(trial)
    end = trial.finish()
    assert end is not None and end.error is None
    return end.exit_status.exit_code


def test_a_preloaded_trial_starts_with_the_framework_imported_and_keeps_its_exit_status(
    tmp_path: Path, preloading_spawner: Spawner
) -> None:
    trial = run(tmp_path, [sys.executable, PROBE, FRAMEWORK], preloading_spawner, code=7)
    assert exit_code(trial) == 7
    assert reported(tmp_path)["preloaded"] == 1
    # Its own session and group, as a fresh trial's: the supervisor is not its leader.
    assert trial.leader is not None and trial.leader[0] != trial.pid


def test_a_trial_not_marked_preload_execs_even_from_the_preloading_spawner(
    tmp_path: Path, preloading_spawner: Spawner
) -> None:
    trial = run(
        tmp_path, [sys.executable, PROBE, FRAMEWORK], preloading_spawner, preload=False, code=3
    )
    assert exit_code(trial) == 3
    assert reported(tmp_path)["preloaded"] == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["/bin/sh", "-c", 'echo "GPUMUX_REPORT {\\"preloaded\\": 0}"; exit 5'],
        # Not `python script.py`: -c cannot start preloaded.
        [
            sys.executable,
            "-c",
            "import runpy, sys; sys.argv[1:] = ['numpy']; "
            f"runpy.run_path({PROBE!r}, run_name='__main__')",
        ],
    ],
    ids=["shell", "python-c"],
)
def test_a_command_that_cannot_start_preloaded_is_executed(
    tmp_path: Path, preloading_spawner: Spawner, argv: list[str]
) -> None:
    trial = run(tmp_path, argv, preloading_spawner, code=5)
    assert exit_code(trial) == 5
    assert reported(tmp_path)["preloaded"] == 0


def test_a_trial_forked_cold_with_the_preload_mark_execs(tmp_path: Path) -> None:
    spawner = Spawner(runs_dir=tmp_path / "runs")
    spawner.start()
    try:
        trial = run(tmp_path, [sys.executable, PROBE, FRAMEWORK], spawner)
        assert exit_code(trial) == 0
    finally:
        spawner.close(kill=True)
    assert reported(tmp_path)["preloaded"] == 0


def test_a_preloaded_supervisor_outlives_the_preloading_spawner(
    tmp_path: Path, preloading_spawner: Spawner
) -> None:
    release = tmp_path / "release"
    waiter = tmp_path / "waiter.py"
    waiter.write_text(
        "import os, sys, time\n"
        f"print('GPUMUX_REPORT {{\"preloaded\": %d}}' % ({FRAMEWORK!r} in sys.modules),"
        " flush=True)\n"
        f"while not os.path.exists({str(release)!r}): time.sleep(0.01)\n"
        "raise SystemExit(4)\n"
    )
    trial = run(tmp_path, [sys.executable, str(waiter)], preloading_spawner)
    assert preloading_spawner.process is not None
    spawner_pid = preloading_spawner.process.pid
    preloading_spawner.close(kill=True)
    assert start_ticks(spawner_pid) is None
    assert start_ticks(trial.pid, living=True) == trial.started and not trial.exited()

    release.touch()
    assert exit_code(trial) == 4
    assert reported(tmp_path)["preloaded"] == 1


def test_a_preload_that_fails_is_said_and_preload_trials_start_from_the_ordinary_spawner(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spawner = Spawner.with_preloading(runs_dir=tmp_path / "runs", preload=["no_such_framework"])
    spawner.start()
    try:
        assert spawner.serving(preload=True) is spawner  # just started: not ready yet
        partner = spawner.preloading_spawner
        assert partner is not None
        deadline = time.monotonic() + TIMEOUT_S
        while partner.failed is None:
            assert not partner.is_ready()
            assert time.monotonic() < deadline, "the failed preload was never said"
            time.sleep(0.02)
        assert "cannot import no_such_framework" in partner.failed
        assert "GPUMUX_PRELOAD" in caplog.text
        assert not partner.running and spawner.serving(preload=True) is spawner
        trial = run(tmp_path, [sys.executable, PROBE, FRAMEWORK], spawner.serving(preload=True))
        assert exit_code(trial) == 0
        assert not partner.is_ready() and spawner.serving(preload=True) is spawner
        # Said once, in the daemon's log; each trial it starts fresh says so in its own log.
        assert caplog.text.count("cannot serve") == 1
        log = (tmp_path / "logs" / "trial.log").read_text()
        assert (
            "gpumux: this --preload trial starts fresh: the preloading spawner did not fork" in log
        )
    finally:
        spawner.close(kill=True)


def test_a_preloaded_trial_gets_broken_pipe_and_file_size_errors_as_a_fresh_one(
    tmp_path: Path, preloading_spawner: Spawner
) -> None:
    # A fresh interpreter ignores SIGPIPE and SIGXFSZ: the write fails instead of killing it.
    script = tmp_path / "writes.py"
    script.write_text(
        "import os, resource, sys\n"
        "read_end, write_end = os.pipe()\n"
        "os.close(read_end)\n"
        "try:\n"
        "    os.write(write_end, b'x')\n"
        "except BrokenPipeError:\n"
        "    pipe = 1\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1, resource.RLIM_INFINITY))\n"
        "big = os.open('big', os.O_WRONLY | os.O_CREAT | os.O_TRUNC)\n"
        "os.write(big, b'x')\n"
        "try:\n"
        "    os.write(big, b'x')\n"
        "except OSError:\n"
        "    size = 1\n"
        f"preloaded = int({FRAMEWORK!r} in sys.modules)\n"
        'print(f\'GPUMUX_REPORT {{"preloaded": {preloaded}, "pipe": {pipe}, "size": {size}}}\')\n'
    )
    for preload in (False, True):
        trial = run(tmp_path, [sys.executable, str(script)], preloading_spawner, preload=preload)
        assert exit_code(trial) == 0
        assert reported(tmp_path) == {"preloaded": int(preload), "pipe": 1, "size": 1}
        (tmp_path / "logs" / "trial.log").unlink()
        shutil.rmtree(tmp_path / "runs" / "3.1")


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"PYTHONHASHSEED": "0"}, "it sets PYTHONHASHSEED, read only as an interpreter starts"),
        (
            {"LD_LIBRARY_PATH": "/opt/cuda/lib64"},
            "its LD_LIBRARY_PATH is not the preloading spawner's",
        ),
    ],
    ids=["hash-seed", "library-path"],
)
def test_a_preloaded_trial_the_preloading_spawner_cannot_honour_starts_fresh_and_says_why(
    tmp_path: Path, preloading_spawner: Spawner, env: dict[str, str], said: str
) -> None:
    spec = launch_spec(tmp_path, [sys.executable, PROBE, FRAMEWORK], preload=True)
    spec = dataclasses.replace(spec, base_env={**spec.base_env, **env})
    trial = SupervisedTrial.spawn(
        spec, run_dir=tmp_path / "runs" / "3.1", options=OPTIONS, spawner=preloading_spawner
    )
    assert exit_code(trial) == 0
    assert reported(tmp_path)["preloaded"] == 0
    lines = (tmp_path / "logs" / "trial.log").read_text().splitlines()
    [line] = [line for line in lines if "starts fresh" in line]
    assert line.startswith("gpumux: this --preload trial starts fresh: ") and said in line


def test_the_preloading_spawner_keeps_the_daemons_library_path_for_trials_that_share_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    spawner = Spawner(runs_dir=tmp_path / "runs", preload=(PRELOADED, FRAMEWORK), preloading=True)
    spawner.start()
    try:
        until_ready(spawner)
        spec = launch_spec(tmp_path, [sys.executable, PROBE, FRAMEWORK], preload=True)
        spec = dataclasses.replace(
            spec, base_env={**spec.base_env, "LD_LIBRARY_PATH": str(tmp_path)}
        )
        trial = SupervisedTrial.spawn(
            spec, run_dir=tmp_path / "runs" / "3.1", options=OPTIONS, spawner=spawner
        )
        assert exit_code(trial) == 0
    finally:
        spawner.close(kill=True)
    assert reported(tmp_path)["preloaded"] == 1
