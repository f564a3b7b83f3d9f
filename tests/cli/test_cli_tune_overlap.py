"""`gpumux tune` on a GPU: the next N starts up while the one before computes, waits at its gate,
and computes only once that one has ended; a round out of memory beside it runs again alone."""

from __future__ import annotations

import contextlib
import glob
import os
import re
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from test_cli_tune import ended_trial, tune_env

from gpumux.cli.overlap import launch_split
from gpumux.cli.rounds import measure_round
from gpumux.devices.simulated.state import COMPUTING
from gpumux.status import TrialStatus
from gpumux.throughput import SAMPLES_PER_S

DEADLINE_S = 180.0
TRIAL = [sys.executable, "-m", "gpumux.devices.simulated.trial"]
LOOK_S = 0.01


def run_tune(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    # Rounds of a few seconds each, on a host that may be busy: more than tune()'s deadline.
    return subprocess.run(
        [sys.executable, "-m", "gpumux", "tune", "--keep", *args],
        env=env, capture_output=True, text=True, timeout=DEADLINE_S,
    )  # fmt: skip


def kept(result: subprocess.CompletedProcess[str], query: str) -> list[tuple[Any, ...]]:
    """The rows of `query` in the database tune kept."""
    found = re.search(r"kept (\S+): the database", result.stderr)
    assert found is not None, result.stderr
    with contextlib.closing(sqlite3.connect(Path(found.group(1)) / "gpumux.db")) as db:
        return db.execute(query).fetchall()


def kept_trials(result: subprocess.CompletedProcess[str]) -> list[tuple[int, int, int, str]]:
    """(sweep id, split launched, pid, started) of each trial in the database tune kept."""
    return [
        (s, n, p, t)
        for s, n, p, t in kept(result, "SELECT sweep_id, split, pid, started_at FROM trials")
    ]


class Computing:
    """Which trial processes compute on the simulated device, looked at until stopped."""

    def __init__(self, tmp: Path) -> None:
        self.looks: list[frozenset[int]] = []
        self._tmp = tmp
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(LOOK_S):
            pids = set()
            for directory in glob.glob(str(self._tmp / "gpumux-simulated-*")):
                with contextlib.suppress(FileNotFoundError):
                    names = os.listdir(directory)
                    pids |= {int(n.split("-")[0]) for n in names if f"-{COMPUTING}-" in n}
            self.looks.append(frozenset(pids))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def test_on_a_gpu_the_next_n_starts_up_beside_the_one_before_and_computes_after_it(
    tmp_path: Path,
    short_tmp_path: Path,
) -> None:
    env = tune_env(tmp_path, short_tmp_path)
    env.update(GPUMUX_SIMULATED_GPU="h200-torch-mlp", GPUMUX_SIMULATED_TIME_SCALE="0.25")
    computing = Computing(Path(env["TMPDIR"]))
    try:
        result = run_tune(env, "--splits", "1,2,3", "--", *TRIAL, "--epochs=10")
    finally:
        computing.stop()
    assert result.returncode == 0, result.stdout + result.stderr
    trials = kept_trials(result)
    sweep_of = {pid: sweep for sweep, _, pid, _ in trials}
    rounds = sorted({sweep for sweep, _, _, _ in trials})
    seen = [look for look in computing.looks if look]
    assert {sweep_of[pid] for look in seen for pid in look} == set(rounds), trials
    # Never two N computing at once: each N's rate is its own.
    assert all(len({sweep_of[pid] for pid in look}) == 1 for look in seen), (trials, seen)
    # Yet each next N was launched before the one before had ended: its start-up overlapped.
    ends: dict[int, str] = dict(
        kept(result, "SELECT sweep_id, max(ended_at) FROM trials GROUP BY sweep_id")
    )
    starts: dict[int, str] = {}
    for sweep, _, _, started in trials:
        starts[sweep] = min(starts.get(sweep, started), started)
    for before, after in zip(rounds, rounds[1:], strict=False):
        assert starts[after] < ends[before], (starts, ends)
    # Each round's trials were launched with room for the next N's beside them.
    assert sorted({(sweep, split) for sweep, split, _, _ in trials}) == list(
        zip(rounds, [3, 5, 5], strict=True)
    )
    assert all(
        "computing alone" in line for line in result.stdout.splitlines() if line.startswith("N=")
    ), result.stdout


def test_a_round_out_of_memory_beside_the_next_n_is_measured_again_alone(
    tmp_path: Path, short_tmp_path: Path
) -> None:
    env = tune_env(tmp_path, short_tmp_path)
    env.update(GPUMUX_SIMULATED_GPU="h200-torch-mlp", GPUMUX_SIMULATED_TIME_SCALE="0.1")
    # 60,000 MiB fits a slice of N=1 (143,771 MiB) or 2, not one of the three N=1 and 2 share.
    result = run_tune(env, "--splits", "1,2", "--", *TRIAL, "--epochs=2", "--memory-mb=60000")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "N=1: out of memory in a slice shared with the next N's start-up" in " ".join(
        result.stderr.split()
    ), result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("N=")]
    assert lines[0].startswith("N=1: 0/1 succeeded"), result.stdout
    assert "CUDA out of memory" in result.stdout, result.stdout
    assert lines[1].startswith("N=1: 1/1 succeeded"), result.stdout
    assert re.search(r"^│\s+1 │\s+1/1 │", result.stdout, re.MULTILINE), result.stdout
    # Again alone, and every N after it: each under its own split, no room beside it.
    launched = sorted((sweep, split) for sweep, split, _, _ in kept_trials(result))
    assert launched == [(1, 3), (2, 1), (3, 2), (3, 2)], launched


def test_a_round_lasts_from_its_first_start_to_its_last_end_less_its_wait_at_the_gate() -> None:
    trials = [
        ended_trial(1, TrialStatus.succeeded, 0.0, 9.0),
        ended_trial(2, TrialStatus.succeeded, 1.0, 10.0),
    ]
    # Ready at 3 s and 4 s, let compute at 6 s: the round would have computed from 4 s.
    measured = measure_round(2, trials, {1: 60.0, 2: 60.0}, {1: 3.0, 2: 3.0}, {1: 3.0, 2: 2.0})
    assert measured.makespan_s == 8.0
    assert measured.seconds_per_trial == 6.5
    assert measured.startup_share == (3.0 / 6.0 + 3.0 / 7.0) / 2
    assert measured.throughput(SAMPLES_PER_S) == 15.0


def test_each_round_leaves_room_for_its_neighbours_on_a_gpu_only() -> None:
    splits = [1, 2, 3, 5, 8, 13, 21, 34]
    assert [launch_split(splits, i, work_cores=None, rounds=1) for i in range(8)] == [
        3, 5, 8, 13, 21, 34, 55, 55,
    ]  # fmt: skip
    assert [launch_split(splits, i, work_cores=2, rounds=1) for i in range(8)] == splits
    assert launch_split(splits, 3, work_cores=None, rounds=2) == 5
    assert launch_split([34, 55], 0, work_cores=None, rounds=1) == 34
    assert launch_split([3], 0, work_cores=None, rounds=1) == 3
