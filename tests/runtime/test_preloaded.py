"""Preloaded start: a trial forked from a parent that imported its framework runs as a fresh one."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpumux.runtime import preloaded

from .support import (
    FIXTURES,
    REPO_ROOT,
    TOKEN,
    gpumux_lines,
    run_python,
    samples_by_epoch,
    serve_reports,
    trial_env,
)

PRELOADED_SCRIPT = FIXTURES / "preloaded_script.py"


def run_preloaded(
    preload: list[str],
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    python: str = sys.executable,
) -> subprocess.CompletedProcess[str]:
    """A real preloading parent (not a trial itself) that forks one trial; the output of both."""
    return run_parent(preload, [(argv, env)], cwd, python)


def run_parent(
    preload: list[str],
    trials: list[tuple[list[str], dict[str, str]]],
    cwd: Path,
    python: str = sys.executable,
) -> subprocess.CompletedProcess[str]:
    """A real preloading parent that forks each trial (argv, environment) in turn."""
    parent_env = {name: value for name, value in os.environ.items() if name in ("PATH", "HOME")}
    parent_env.update(PYTHONPATH=str(REPO_ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    requests = [
        json.dumps({"preload": preload, "argv": argv, "env": env, "cwd": str(cwd)})
        for argv, env in trials
    ]
    return run_python([str(FIXTURES / "preloading_parent.py"), *requests], parent_env, cwd, python)


def child_exit(result: subprocess.CompletedProcess[str]) -> int:
    """The forked trial's exit status, as its parent printed it."""
    assert result.returncode == 0, result.stdout
    lines = [line for line in result.stdout.splitlines() if line.startswith("parent: child exit")]
    assert len(lines) == 1, result.stdout
    return int(lines[0].rsplit(" ", 1)[1])


def script_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("script:")]


@dataclass
class Forked:
    """A trial the TensorFlow parent forked: its exit status, what was printed from the
    parent's line before it on, the requests it sent (their bodies: reports)."""

    exit: int
    output: str
    requests: list[dict[str, Any]]

    @property
    def reports(self) -> list[dict[str, Any]]:
        return [request["body"] for request in self.requests]


@dataclass
class TensorflowParent:
    """What the parent printed, and each of its trials by name."""

    stdout: str
    trials: dict[str, Forked]


# What a GPU slice needs: TensorFlow not initialised by the parent, so the child may still split
# a device into logical ones (here the CPU, as no GPU is needed to show it).
CONFIGURE_DEVICES = (
    "import tensorflow as tf\n"
    "cpu = tf.config.list_physical_devices('CPU')[0]\n"
    "two = [tf.config.LogicalDeviceConfiguration()] * 2\n"
    "tf.config.set_logical_device_configuration(cpu, two)\n"
    "print('script: logical CPUs', len(tf.config.list_logical_devices('CPU')))\n"
)


@pytest.fixture(scope="module")
def tensorflow_parent(tmp_path_factory: pytest.TempPathFactory) -> TensorflowParent:
    """One parent that preloads TensorFlow and Keras forks the trials of the three tests below,
    one after another, as the daemon's preloaded start forks each trial from one parent:
    TensorFlow's seconds of imports once, not once a test. Each trial reports to its own
    server."""
    cwd = tmp_path_factory.mktemp("preloaded")
    devices = cwd / "devices.py"
    devices.write_text(CONFIGURE_DEVICES)
    with serve_reports() as keras, serve_reports() as reports:
        trials = {
            "keras": ([sys.executable, str(FIXTURES / "keras_fit.py")], trial_env(keras.url)),
            "reports": ([sys.executable, str(FIXTURES / "report_some.py")], trial_env(reports.url)),
            # It reports nothing: no report server.
            "devices": ([sys.executable, str(devices)], trial_env(None)),
        }
        result = run_parent(["tensorflow", "keras"], list(trials.values()), cwd)
    assert result.returncode == 0, result.stdout
    # [output, exit, output, exit, output, exit, ""]: what came before each exit line.
    parts = re.split(r"^parent: child exit (-?\d+)\n", result.stdout, flags=re.MULTILINE)
    assert len(parts) == 2 * len(trials) + 1 and parts[-1] == "", result.stdout
    sent = {"keras": keras.requests, "reports": reports.requests, "devices": []}
    return TensorflowParent(
        stdout=result.stdout,
        trials={
            name: Forked(exit=int(parts[2 * i + 1]), output=parts[2 * i], requests=sent[name])
            for i, name in enumerate(trials)
        },
    )


@pytest.mark.slow
def test_a_forked_tensorflow_trial_is_capped_and_measured(
    tensorflow_parent: TensorflowParent,
) -> None:
    trial = tensorflow_parent.trials["keras"]

    assert trial.exit == 0, trial.output
    assert "parent: python threads []" in tensorflow_parent.stdout.splitlines()
    assert gpumux_lines(trial.output) == [
        "gpumux: tensorflow: CPU device, 1 intra-op and 1 inter-op thread(s) (split 2), "
        "applied before TensorFlow initialised"
    ]
    lines = script_lines(trial.output)
    assert "script: intra-op threads 1" in lines
    assert "script: inter-op threads 1" in lines
    assert lines[-1] == "script: done"
    assert samples_by_epoch(trial.reports) == [(0, 192.0), (1, 192.0)]
    for report in trial.reports:
        assert (report["trial_id"], report["attempt"]) == (7, 2)
    assert {r["authorization"] for r in trial.requests} == {f"Bearer {TOKEN}"}


@pytest.mark.slow
def test_the_first_report_counts_from_the_trials_start_not_the_parents(
    tensorflow_parent: TensorflowParent,
) -> None:
    trial = tensorflow_parent.trials["reports"]

    assert trial.exit == 0, trial.output
    preloaded = [line for line in tensorflow_parent.stdout.splitlines() if "preloaded in" in line]
    preload_s = float(preloaded[0].split()[-2])
    reports = trial.reports
    assert [report["step"] for report in reports] == [0, 1, 2]
    # The parent loaded the runtime before its seconds-long preload; the trial began after it.
    assert reports[0]["seconds"] < preload_s / 2, (preload_s, tensorflow_parent.stdout)


@pytest.mark.slow
def test_a_forked_trial_can_still_configure_tensorflow_devices(
    tensorflow_parent: TensorflowParent,
) -> None:
    trial = tensorflow_parent.trials["devices"]

    assert trial.exit == 0, trial.output
    assert script_lines(trial.output) == ["script: logical CPUs 2"]


def test_the_child_runs_the_script_as_main_in_the_trials_place(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = trial_env(None)

    result = run_preloaded(
        ["json"], [sys.executable, "-u", str(PRELOADED_SCRIPT), "ok", "--x=1"], env, workdir
    )

    assert child_exit(result) == 0
    assert script_lines(result.stdout) == [
        "script: __name__ __main__",
        f"script: argv {[str(PRELOADED_SCRIPT), 'ok', '--x=1']}",
        f"script: cwd {workdir}",
        f"script: path0 {FIXTURES}",
        "script: trial 7 params {'lr': 0.01}",
        "script: end",
        "script: thread finished",
        "script: atexit ran",
    ]


def test_the_child_runs_a_module_with_dash_m(tmp_path: Path) -> None:
    argv = ["python", "-m", "preloaded_script", "ok"]
    env = trial_env(None, PATH=os.path.dirname(sys.executable))

    result = run_preloaded(["json"], argv, env, FIXTURES)

    assert child_exit(result) == 0
    lines = script_lines(result.stdout)
    assert lines[:4] == [
        "script: __name__ __main__",
        f"script: argv {[str(PRELOADED_SCRIPT), 'ok']}",
        f"script: cwd {FIXTURES}",
        f"script: path0 {FIXTURES}",
    ]
    assert lines[-1] == "script: atexit ran"


@pytest.mark.parametrize(
    ("how", "status", "said"),
    [
        ("exit3", 3, None),
        ("message", 1, "script: gave up"),
        ("raise", 1, "RuntimeError: script: broke"),
        ("interrupt", -signal.SIGINT, "KeyboardInterrupt"),
        ("term", -signal.SIGTERM, None),
    ],
)
def test_the_child_exits_as_a_cold_interpreter_would(
    how: str, status: int, said: str | None, tmp_path: Path
) -> None:
    argv = [sys.executable, str(PRELOADED_SCRIPT), how]
    fresh = run_python(argv[1:], trial_env(None), tmp_path)

    result = run_preloaded(["json"], argv, trial_env(None), tmp_path)

    assert child_exit(result) == fresh.returncode == status
    lines = result.stdout.splitlines()
    if said is not None:
        # The script's thread may print anywhere in the message (the traceback is written in
        # pieces), in a fresh interpreter as in a preloaded one: its line is taken out first.
        thread_line = "script: thread finished\n"
        assert said in result.stdout.replace(thread_line, ""), result.stdout
        assert said in fresh.stdout.replace(thread_line, ""), fresh.stdout
    if how == "raise":
        assert "Traceback (most recent call last):" in lines
    assert ("script: atexit ran" in lines) is (how != "term")
    assert "parent: SIGTERM handled" not in lines


def test_openblas_loaded_by_the_parent_gets_the_trials_threads(tmp_path: Path) -> None:
    # OpenBLAS reads OPENBLAS_NUM_THREADS when it loads, which was in the parent, without it.
    argv = [sys.executable, str(FIXTURES / "openblas_threads.py")]
    env = trial_env(None, OPENBLAS_NUM_THREADS="1")

    result = run_preloaded(["numpy", "scipy.linalg"], argv, env, tmp_path)

    assert child_exit(result) == 0
    counts = json.loads(script_lines(result.stdout)[0].removeprefix("script: openblas threads "))
    assert counts and set(counts) == {1}, result.stdout


def test_script_argv_takes_this_interpreter_running_a_script() -> None:
    env = {"PATH": os.path.dirname(sys.executable)}
    python = os.path.basename(sys.executable)

    assert preloaded.script_argv([python, "train.py", "--lr=1"], env) == ["train.py", "--lr=1"]
    assert preloaded.script_argv([sys.executable, "-u", "train.py"], env) == ["train.py"]
    assert preloaded.script_argv([python, "-m", "pkg.train", "-x"], env) == [
        "-m",
        "pkg.train",
        "-x",
    ]


@pytest.mark.parametrize(
    "argv",
    [[], ["sh", "-c", "true"], ["PYTHON", "-c", "pass"], ["PYTHON", "-O", "t.py"], ["PYTHON"]],
)
def test_script_argv_leaves_other_commands_cold(argv: list[str]) -> None:
    env = {"PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}/usr/bin:/bin"}
    argv = [sys.executable if arg == "PYTHON" else arg for arg in argv]

    assert preloaded.script_argv(argv, env) is None


def test_script_argv_refuses_another_interpreter(tmp_path: Path) -> None:
    other = tmp_path / "bin" / "python"
    other.parent.mkdir()
    other.symlink_to(os.path.realpath(sys.executable))

    assert preloaded.script_argv(["python", "train.py"], {"PATH": str(other.parent)}) is None


def test_run_trial_refuses_a_command_it_cannot_run_preloaded(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not `python script.py` with this interpreter"):
        preloaded.run_trial(["sh", "-c", "true"], {"PATH": "/usr/bin:/bin"}, str(tmp_path))


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"LD_PRELOAD": "/lib/libfake.so"}, "its LD_PRELOAD is not the preloading spawner's"),
        ({"PYTHONHASHSEED": "0", "PYTHONWARNINGS": "error"}, "PYTHONHASHSEED, PYTHONWARNINGS"),
        ({"PYTHONIOENCODING": "latin-1"}, "it sets PYTHONIOENCODING"),
    ],
)
def test_a_trial_that_needs_a_fresh_interpreter_or_loader_starts_cold(
    env: dict[str, str], said: str
) -> None:
    base = {"PATH": os.path.dirname(sys.executable)}
    argv = [sys.executable, "train.py"]
    assert preloaded.fresh_reason(argv, base) is None

    reason = preloaded.fresh_reason(argv, {**base, **env})

    assert reason is not None and said in reason


def test_what_a_preloaded_child_applies_itself_does_not_make_a_trial_fresh() -> None:
    env = {
        "PATH": os.path.dirname(sys.executable),
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUSERBASE": "/u",
        "PYTHONHASHSEED": "",
        "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", ""),
    }

    assert preloaded.fresh_reason([sys.executable, "train.py"], env) is None


def test_run_trial_refuses_a_trial_that_must_start_cold(tmp_path: Path) -> None:
    env = {"PATH": os.path.dirname(sys.executable), "PYTHONHASHSEED": "1"}
    with pytest.raises(ValueError, match="cannot start preloaded: it sets PYTHONHASHSEED"):
        preloaded.run_trial([sys.executable, "train.py"], env, str(tmp_path))


def test_the_child_has_the_users_site_packages_as_a_cold_interpreter(tmp_path: Path) -> None:
    # Outside a virtual environment, where `python script.py` has the user's site-packages:
    # the preloading parent runs with the daemon's HOME, the trial with its own.
    python = os.path.realpath(sys.executable)
    home = tmp_path / "home"
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    user_site = home / ".local" / "lib" / version / "site-packages"
    user_site.mkdir(parents=True)
    (user_site / "users_module.py").write_text("WHERE = 'user site'\n")
    script = tmp_path / "uses.py"
    script.write_text("import users_module\nprint('script:', users_module.WHERE)\n")
    env = trial_env(None, HOME=str(home), PYTHONNOUSERSITE=None)
    fresh = run_python([str(script)], env, tmp_path, python=python)
    assert script_lines(fresh.stdout) == ["script: user site"], fresh.stdout

    result = run_preloaded(["json"], [python, str(script)], env, tmp_path, python=python)

    assert child_exit(result) == 0
    assert script_lines(result.stdout) == ["script: user site"]


def test_a_virtual_environment_without_system_packages_has_no_user_site(tmp_path: Path) -> None:
    assert preloaded.user_site_enabled(str(tmp_path))
    (tmp_path / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    assert not preloaded.user_site_enabled(str(tmp_path))
    (tmp_path / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = True\n")
    assert preloaded.user_site_enabled(str(tmp_path))
