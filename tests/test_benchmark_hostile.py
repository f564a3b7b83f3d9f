"""The parts of benchmarks/hostile.py that its figures rest on: its hostile trials do what they
say (a bomb of exactly its budget, a grandchild in a session of its own), the census finds
them by their marker, and the latency figures are read right. (A whole run, even a tiny one,
takes about a minute here: it is the benchmark's to run, not the suite's.)"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def trials() -> ModuleType:
    """benchmarks/hostile_trials.py, imported as its script runs it: beside soak.py."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))
        return importlib.import_module("hostile_trials")


@pytest.fixture
def marked(tmp_path: Path, trials: ModuleType) -> Iterator[Callable[..., Path]]:
    """Run one of the hostile scripts as the benchmark's trials run it, under a marker of this
    test's own (returned); whatever carries it is killed after the test."""
    mark = tmp_path / "mark"
    started: list[subprocess.Popen[bytes]] = []

    def start(kind: str, *argv: str) -> Path:
        name, text = trials.SCRIPTS[kind]
        script = tmp_path / name
        script.write_text(text)
        started.append(
            subprocess.Popen(
                [sys.executable, "-I", str(script), *argv],
                env={"PATH": "/usr/bin:/bin", trials.MARK: str(mark)},
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        return mark

    yield start
    trials.kill_all(list(trials.census(mark)))
    for popen in started:
        popen.wait(timeout=30)


def wait_for_census(
    trials: ModuleType,
    mark: Path,
    count: int,
    ready: Callable[[dict[int, str]], bool] = lambda found: True,
) -> dict[int, str]:
    """The marked processes once there are `count` of them or more and `ready` holds."""
    deadline = time.monotonic() + 30
    while len(found := trials.census(mark)) < count or not ready(found):
        assert time.monotonic() < deadline, f"{len(found)} of {count} processes: {found}"
        time.sleep(0.05)
    return dict(found)


def test_the_fork_bomb_makes_its_budget_of_processes_and_no_more(
    trials: ModuleType, marked: Callable[..., Path]
) -> None:
    mark = marked("fork bomb", "10")
    found = wait_for_census(trials, mark, 11)
    assert len(found) == 11, found
    trials.kill_all(list(found))
    assert trials.settle(mark, 10) == {}


def test_the_escaped_grandchild_leaves_the_trials_session_and_keeps_its_marker(
    trials: ModuleType, marked: Callable[..., Path]
) -> None:
    # The trial and its grandchild once it runs `sleep`: before, the census may catch the child
    # or the grandchild still a copy of the trial's Python (seen once in CI).
    found = wait_for_census(
        trials,
        marked("escape"),
        2,
        ready=lambda found: len(found) == 2 and any(c.startswith("sleep ") for c in found.values()),
    )
    [sleeper] = [pid for pid, command in found.items() if command.startswith("sleep ")]
    [trial] = set(found) - {sleeper}
    assert os.getsid(sleeper) != os.getsid(trial)
    # Its parent, the session's leader, has exited: a stop of the trial's group misses it.
    parent = int(Path(f"/proc/{sleeper}/stat").read_text().rpartition(")")[2].split()[1])
    assert parent != trial
    assert os.getpgid(sleeper) != os.getpgid(trial)


def test_latency_figures_are_percentiles_over_every_node() -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))
        nodes = importlib.import_module("hostile_nodes")
    first = nodes.HealthPoller("http://127.0.0.1:1", 0.05, 10.0)
    second = nodes.HealthPoller("http://127.0.0.1:2", 0.05, 10.0)
    first.seconds = [0.001 * n for n in range(1, 100)]
    second.seconds, second.timeouts = [10.0], 1
    figures = nodes.latency_figures([first, second])
    assert figures == {
        "requests": 100,
        "p50_ms": 50.5,
        "p99_ms": 198.0,
        "worst_ms": 10000.0,
        "timeouts": 1,
        "failures": 0,
    }
