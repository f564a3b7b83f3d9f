"""`gpumux tune` as a person reads it: progress from the start, the result before its daemon
stops, what a surprising best N means, and its curve kept as the workload's profile."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from builders import terminal_signals
from test_cli_tune import STARTED_THEN_BLOCK, T0, ended_trial, tune, tune_env

from gpumux.cli.app import main as run_cli
from gpumux.cli.rounds import measure_round
from gpumux.cli.state import EmbeddedDaemon
from gpumux.cli.tune_result import HostLoad, explain, startup_s
from gpumux.client import Client
from gpumux.config import Settings
from gpumux.main import ServerDaemons
from gpumux.schemas.reports import ReportPublic
from gpumux.schemas.sweeps import SweepCreate
from gpumux.server.daemon import embedded
from gpumux.status import TrialStatus

DEADLINE_S = 120.0
SIMULATED = "a100-compute-bound"
SCALE = "0.05"
TRIAL = [sys.executable, "-m", "gpumux.devices.simulated.trial", "--epochs=2"]


def read_until(stream: object, pattern: str, seen: list[str]) -> None:
    """Read lines of a text stream into `seen` until one matches `pattern`."""
    assert hasattr(stream, "readline")
    while line := stream.readline():
        seen.append(line)
        if re.search(pattern, line):
            return
    raise AssertionError(f"{pattern!r} never came: {''.join(seen)}")


def test_tune_says_what_it_does_from_its_first_line_and_while_a_round_runs(
    tmp_path: Path,
    short_tmp_path: Path,
) -> None:
    env = tune_env(tmp_path, short_tmp_path)
    started = tmp_path / "started"
    tuner = subprocess.Popen(
        [sys.executable, "-m", "gpumux", "tune", "--splits", "1",
         "--", sys.executable, "-c", STARTED_THEN_BLOCK, str(started)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=terminal_signals,
    )  # fmt: skip
    try:
        seen: list[str] = []
        read_until(tuner.stderr, r"N=1: 1 trial running; measuring", seen)
        # Its own line comes first, before the daemon it starts says anything.
        assert seen[0] == "gpumux: starting a daemon of its own on a temporary database\n", seen
        assert any(line == "gpumux: N=1: starting 1 trial\n" for line in seen), seen
        # The trial blocks for good: the lines came while it ran, not after the round.
        assert tuner.poll() is None
        deadline = time.monotonic() + DEADLINE_S
        while not (started.exists() and started.read_text()):
            assert time.monotonic() < deadline, "the trial never started"
            time.sleep(0.05)
    finally:
        # Ctrl-C: tune stops the trial it started and removes its data.
        tuner.send_signal(signal.SIGINT)
        tuner.communicate(timeout=DEADLINE_S)
    assert tuner.returncode == 130


class RecordingDaemons(ServerDaemons):
    """The real embedded daemon, noting what stdout held when it stopped."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys
        self.printed_before_stop = ""

    @contextlib.contextmanager
    def embedded(self, settings: Settings) -> Iterator[EmbeddedDaemon]:
        with super().embedded(settings) as running:
            yield running
            self.printed_before_stop = self.capsys.readouterr().out


def test_the_result_is_printed_before_its_daemon_stops(
    tmp_path: Path,
    short_tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in tune_env(tmp_path, short_tmp_path).items():
        monkeypatch.setenv(name, value)
    daemons = RecordingDaemons(capsys)
    # The command line takes SIGTERM and SIGHUP as Ctrl-C: pytest's own handlers come back.
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with pytest.raises(SystemExit) as exit_:
            run_cli(["tune", "--splits", "1", "--", "true"], daemons=daemons)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert exit_.value.code == 0
    # The table, the best N and the chart: all there while the daemon still ran.
    assert re.search(r"^best: N=1 on ", daemons.printed_before_stop, re.MULTILINE), (
        daemons.printed_before_stop
    )
    assert "◀ best" in daemons.printed_before_stop


def report(trial_id: int, at_s: float, samples: float) -> ReportPublic:
    return ReportPublic(
        attempt=1, kind="epoch", at=T0 + timedelta(seconds=at_s), step=None, samples=samples,
        seconds=None, samples_per_s=None, metrics={},
    )  # fmt: skip


def test_start_up_is_what_the_first_report_took_beyond_the_later_pace() -> None:
    trial = ended_trial(1, TrialStatus.succeeded, 0.0, 12.0)
    # 100 samples a second from the second report on: the first 100 took 1 s after 9 s of start.
    reports = [report(1, 10.0, 100), report(1, 11.0, 100), report(1, 12.0, 100)]
    assert startup_s(trial, reports) == pytest.approx(9.0)
    assert startup_s(trial, reports[:1]) is None
    measured = measure_round(1, [trial], {1: 300.0}, {1: 9.0})
    assert measured.startup_share == pytest.approx(0.75)


def test_a_surprising_best_n_says_what_it_means() -> None:
    cores = len(os.sched_getaffinity(0))
    trials = [ended_trial(i, TrialStatus.succeeded, 0.0, 10.0) for i in range(1, cores + 2)]
    startups = {t.id: 6.0 for t in trials}
    beyond = measure_round(cores + 1, trials, {}, startups)
    quiet = HostLoad(cores=cores, samples=[0.0])
    lines = explain(beyond, cpu_cores=cores, load=quiet)
    assert lines[0].startswith(f"start-up took 60% of each trial at N={cores + 1}")
    assert lines[1].startswith(f"N={cores + 1} is more trials than this host's {cores} cores")
    assert (
        lines[2]
        == f"measured while other work kept the host's load average at about 0.0 on {cores} cores"
    )
    # On a GPU, with short start-ups, on a quiet host: nothing to explain.
    brief = measure_round(cores + 1, trials, {}, {t.id: 1.0 for t in trials})
    assert explain(brief, cpu_cores=None, load=quiet) == []
    busy = HostLoad(cores=cores, samples=[cores * 3.0])
    assert explain(brief, cpu_cores=None, load=busy) == [
        f"measured while other work kept the host's load average at about {cores * 3.0:.1f} on "
        f"{cores} cores: an idle host may find another N"
    ]


def test_a_surprising_best_n_is_explained_under_the_result(
    tmp_path: Path, short_tmp_path: Path
) -> None:
    env = {**tune_env(tmp_path, short_tmp_path), "COLUMNS": "100"}
    env.update(GPUMUX_SIMULATED_GPU=SIMULATED, GPUMUX_SIMULATED_TIME_SCALE=SCALE)
    # Two short epochs after the model's start-up: the trials mostly start.
    result = tune("--splits", "1,2", "--", *TRIAL, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    # At 100 columns the lines wrap: read them as a person does, as one text.
    text = " ".join(result.stdout.split())
    best = re.search(r"best: N=(\d+) on .*? start-up took (\d+)% of each trial at N=\1: ", text)
    assert best is not None, result.stdout
    assert int(best.group(2)) > 50


def test_tunes_curve_is_the_profile_the_next_auto_sweep_starts_settled_from(
    tmp_path: Path,
    short_tmp_path: Path,
) -> None:
    env = tune_env(tmp_path, short_tmp_path)
    env.update(GPUMUX_SIMULATED_GPU=SIMULATED, GPUMUX_SIMULATED_TIME_SCALE=SCALE)
    settings = Settings(
        home=tmp_path / "home", simulated_gpu=SIMULATED, simulated_time_scale=float(SCALE),
        poll_interval=0.2,
    )  # fmt: skip
    with embedded(settings) as daemon, Client(daemon.url) as client:
        result = tune("--splits", "1,2,3", "--", *TRIAL, env=env, cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        best = re.search(r"^best: N=(\d+) on ", result.stdout, re.MULTILINE)
        assert best is not None, result.stdout
        split = int(best.group(1))
        kept = re.search(r"kept as profile (\d+): the next", " ".join(result.stderr.split()))
        assert kept is not None, result.stderr
        profile = client.get_profile(int(kept.group(1)))
        assert (profile.settled, profile.best_split) == (True, split)
        # The directory apart from the command, as a sweep's profile keeps them.
        assert (profile.workdir, profile.command) == (str(tmp_path), TRIAL)
        assert [p.split for p in profile.curve] == [1, 2, 3]
        created = client.create_sweep(
            SweepCreate(
                params=[], trials=3, command=TRIAL, workdir=str(tmp_path),
                env=dict(os.environ), split="auto",
            )
        )  # fmt: skip
        deadline = time.monotonic() + DEADLINE_S
        while client.get_sweep(created.id).status != "finished":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        # Every trial at tune's best N from the first: no search phase measured another.
        assert {t.split for t in client.all_trials(created.id)} == {split}
        after = client.get_profile(profile.id)
        assert (after.settled, after.best_split, after.curve) == (True, split, profile.curve)
