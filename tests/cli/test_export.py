"""`gpumux export --optuna`: the conversion on its own, then a real sweep loaded back by Optuna."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import optuna
import pytest
from builders import daemon_token, sweep_public, trial_public
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState
from ports import free_port

from gpumux.cli.export import study_trials
from gpumux.cli.state import CliError
from gpumux.client import Client
from gpumux.config import Settings
from gpumux.schemas.reports import ReportPublic
from gpumux.schemas.sweeps import SweepCreate, SweepPublic
from gpumux.schemas.trials import TrialPublic
from gpumux.server.daemon import embedded
from gpumux.status import SearchMethod, SweepStatus, TrialStatus

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
DEADLINE_S = 60.0
# A trial that reports loss = (x - 2)**2 + 1/(step + 1) at steps 0..3; x=3 fails after two.
STEPPED = """\
import json, os, sys, urllib.request

x = json.loads(os.environ["GPUMUX_PARAMS"])["x"]
for step in range(4):
    if x == 3 and step == 2:
        sys.exit("x=3 diverged")
    body = {
        "trial_id": int(os.environ["GPUMUX_TRIAL_ID"]),
        "attempt": int(os.environ["GPUMUX_ATTEMPT"]),
        "kind": "manual",
        "step": step,
        "metrics": {"loss": (x - 2) ** 2 + 1 / (step + 1)},
    }
    request = urllib.request.Request(
        os.environ["GPUMUX_URL"] + "/reports",
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": "Bearer " + os.environ["GPUMUX_TRIAL_TOKEN"],
        },
    )
    urllib.request.urlopen(request, timeout=30).close()
"""


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def local(moment: datetime) -> datetime:
    """A moment as Optuna stores it: local time without a zone."""
    return moment.astimezone().replace(tzinfo=None)


def a_sweep(params: list[str], **fields: Any) -> SweepPublic:
    values: dict[str, Any] = dict(
        id=4,
        params=params,
        search=SearchMethod.grid,
        seed=7,
        split=2,
        objective="loss:min",
        trial_count=10,
        created_at=T0,
    )
    return sweep_public(**(values | fields))


def trial(number: int, status: TrialStatus, params: dict[str, Any], **fields: Any) -> TrialPublic:
    """Trial `number` (id 100 + number), started at `number` s and ended 10 s later if final."""
    values: dict[str, Any] = dict(
        id=100 + number,
        sweep_id=4,
        number=number,
        params=params,
        status=status,
        queued_at=T0,
        started_at=at(number),
        ended_at=at(number + 10) if status.is_final else None,
    )
    return trial_public(**(values | fields))


def report(step: int | None, attempt: int = 1, **metrics: float) -> ReportPublic:
    return ReportPublic(
        attempt=attempt,
        kind="manual",
        at=T0,
        step=step,
        samples=None,
        seconds=None,
        samples_per_s=None,
        metrics=metrics,
    )


def test_each_status_becomes_the_optuna_state_of_the_same_meaning() -> None:
    sweep = a_sweep(["x=1..3", "opt=adam,sgd", "tag=demo"])
    p = {"x": 2, "opt": "adam", "tag": "demo"}
    trials = [
        trial(0, TrialStatus.succeeded, p, objective=0.25, exit_code=0, samples_per_s=80.0),
        trial(1, TrialStatus.pruned, p | {"x": 3}, step=1, error="pruned at step 1"),
        trial(2, TrialStatus.failed, p, exit_code=1, error="exited with code 1"),
        trial(3, TrialStatus.lost, p),
        trial(4, TrialStatus.cancelled, p, signal=15),
        trial(5, TrialStatus.running, p | {"opt": "sgd"}, attempt=2),
        # It exited 0 without ever reporting the objective: Optuna would call that a failure.
        trial(6, TrialStatus.succeeded, p, exit_code=0),
        trial(7, TrialStatus.cancelled, p, started_at=None, ended_at=at(1)),
        trial(8, TrialStatus.queued, p, started_at=None),
    ]
    reports = {
        100: [report(0, loss=1.0), report(1, loss=0.5), report(None, loss=0.25)],
        101: [report(0, loss=2.0), report(1, loss=3.0, acc=0.1), report(1, loss=2.5)],
        105: [report(0, attempt=1, loss=9.0), report(3, attempt=2, loss=0.7, acc=0.9)],
    }
    frozen = study_trials(sweep, trials, reports)

    assert [t.user_attrs["gpumux_trial_id"] for t in frozen] == [100, 101, 102, 103, 104, 105, 106]
    assert [t.state for t in frozen] == [
        TrialState.COMPLETE,
        TrialState.PRUNED,
        TrialState.FAIL,
        TrialState.FAIL,
        TrialState.FAIL,
        TrialState.RUNNING,
        TrialState.FAIL,
    ]
    # The trial's own value; a pruned trial's is its last step's, as Optuna's tell sets it.
    assert [t.value for t in frozen] == [0.25, 2.5, None, None, None, None, None]
    # Only the current attempt's reports with a step; a step reported twice keeps the last.
    assert [t.intermediate_values for t in frozen] == [
        {0: 1.0, 1: 0.5},
        {0: 2.0, 1: 2.5},
        {},
        {},
        {},
        {3: 0.7},
        {},
    ]
    succeeded, pruned, failed, lost, cancelled, running, _ = frozen
    assert succeeded.params == {"x": 2, "opt": "adam"}
    assert succeeded.distributions == {
        "x": IntDistribution(1, 3),
        "opt": CategoricalDistribution(("adam", "sgd")),
    }
    assert succeeded.user_attrs == {
        "tag": "demo",
        "gpumux_trial_id": 100,
        "gpumux_status": "succeeded",
        "gpumux_attempt": 1,
        "gpumux_exit_code": 0,
        "gpumux_samples_per_s": 80.0,
    }
    assert pruned.user_attrs["gpumux_step"] == 1
    assert pruned.user_attrs["gpumux_error"] == "pruned at step 1"
    assert failed.user_attrs["gpumux_exit_code"] == 1
    assert lost.user_attrs["gpumux_status"] == "lost"
    assert cancelled.user_attrs["gpumux_signal"] == 15
    assert running.user_attrs["gpumux_attempt"] == 2
    assert frozen[6].user_attrs["gpumux_error"] == "it ended without reporting loss"
    assert (succeeded.datetime_start, succeeded.datetime_complete) == (local(at(0)), local(at(10)))
    assert (running.datetime_start, running.datetime_complete) == (local(at(5)), None)


def test_a_random_search_draws_over_the_whole_range_of_a_gridded_one() -> None:
    # :5 names grid points, but a random search draws anywhere between the ends.
    sweep = a_sweep(["lr=1e-3..1e-1:5"], search=SearchMethod.random, trials=3)
    drawn = trial(0, TrialStatus.succeeded, {"lr": 0.0123456789}, objective=0.5)
    (frozen,) = study_trials(sweep, [drawn], {})
    assert frozen.distributions == {"lr": FloatDistribution(1e-3, 1e-1, log=True)}
    grid = a_sweep(["lr=1e-3..1e-1:3"])
    (point,) = study_trials(grid, [trial(0, TrialStatus.succeeded, {"lr": 0.01}, objective=1)], {})
    assert point.distributions == {"lr": CategoricalDistribution((0.001, 0.01, 0.1))}


def test_a_sweep_without_an_objective_is_refused() -> None:
    sweep = a_sweep(["x=1..3"], objective=None)
    with pytest.raises(CliError, match="sweep 4 has no objective") as refused:
        study_trials(sweep, [trial(0, TrialStatus.succeeded, {"x": 1})], {})
    assert refused.value.exit_code == 2


def test_a_value_outside_its_distribution_names_the_trial() -> None:
    sweep = a_sweep(["x=1..3"])
    with pytest.raises(CliError, match="trial 100 cannot be written as an Optuna trial"):
        study_trials(sweep, [trial(0, TrialStatus.succeeded, {"x": 7}, objective=1.0)], {})


# ---------------------------------------------------------------- a real daemon


@dataclass
class Daemon:
    url: str
    env: dict[str, str]
    client: Client


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """An embedded daemon and the environment of a CLI user who talks to it."""
    home = tmp_path / "home"
    settings = Settings(home=home, url=f"http://127.0.0.1:{free_port()}", split_search=False)
    env = {name: value for name, value in os.environ.items() if not name.startswith("GPUMUX_")}
    env.update(GPUMUX_HOME=str(home), GPUMUX_URL=settings.url, COLUMNS="200")
    with embedded(settings) as running:
        with Client(running.url, timeout=10, token=daemon_token(home)) as client:
            yield Daemon(running.url, env, client)


def gpumux(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpumux", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )


def run_sweep(daemon: Daemon, workdir: Path, *params: str, **fields: Any) -> SweepPublic:
    """Submit a sweep of the stepped script and wait for its end."""
    script = workdir / "stepped.py"
    script.write_text(STEPPED)
    created = daemon.client.create_sweep(
        SweepCreate(
            params=list(params),
            command=[sys.executable, str(script)],
            workdir=str(workdir),
            env=dict(os.environ),
            **fields,
        )
    )
    deadline = time.monotonic() + DEADLINE_S
    while (sweep := daemon.client.get_sweep(created.id)).status != SweepStatus.finished:
        assert time.monotonic() < deadline, f"sweep {created.id} did not finish: {sweep}"
        time.sleep(0.1)
    return sweep


def test_an_exported_sweep_loads_in_optuna_with_every_trial(daemon: Daemon, tmp_path: Path) -> None:
    sweep = run_sweep(daemon, tmp_path, "x=1..3", "tag=demo", objective="loss:min", split=2)
    assert sweep.counts == {TrialStatus.succeeded: 2, TrialStatus.failed: 1}
    # A relative URL is the user's: it names a file in the directory they run gpumux from.
    result = gpumux("export", str(sweep.id), "--optuna", "sqlite:///study.db", env=daemon.env,
                    cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    name = f"gpumux-sweep-{sweep.id}"
    assert result.stdout == (
        f"sweep {sweep.id}: 3 trials written to the study '{name}' in sqlite:///study.db "
        "(2 COMPLETE, 1 FAIL)\n"
    )
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.load_study(study_name=name, storage=storage)
    assert study.direction == optuna.study.StudyDirection.MINIMIZE
    assert study.user_attrs["gpumux_sweep_id"] == sweep.id
    objective = {k: v for k, v in study.user_attrs.items() if k.startswith("gpumux_objective")}
    assert objective == {"gpumux_objective_metric": "loss", "gpumux_objective_mode": "min"}
    ones, twos, threes = study.trials
    assert [t.params for t in study.trials] == [{"x": 1}, {"x": 2}, {"x": 3}]
    assert all(t.distributions == {"x": IntDistribution(1, 3)} for t in study.trials)
    assert all(t.user_attrs["tag"] == "demo" for t in study.trials)
    assert [t.state for t in study.trials] == [
        TrialState.COMPLETE,
        TrialState.COMPLETE,
        TrialState.FAIL,
    ]
    assert ones.value == pytest.approx(1 + 1 / 4)
    assert twos.value == pytest.approx(1 / 4)
    assert twos.intermediate_values == pytest.approx({0: 1.0, 1: 1 / 2, 2: 1 / 3, 3: 1 / 4})
    assert threes.intermediate_values == pytest.approx({0: 2.0, 1: 1.5})
    assert threes.user_attrs["gpumux_exit_code"] == 1
    assert "x=3 diverged" in threes.user_attrs["gpumux_error"]
    assert study.best_trial.user_attrs["gpumux_trial_id"] == twos.user_attrs["gpumux_trial_id"]

    again = gpumux("export", str(sweep.id), "--optuna", "sqlite:///study.db", env=daemon.env,
                   cwd=tmp_path)  # fmt: skip
    assert again.returncode == 2
    assert f"the study '{name}' already exists" in again.stderr
    assert "--overwrite" in again.stderr
    assert len(optuna.load_study(study_name=name, storage=storage).trials) == 3
    replaced = gpumux("export", str(sweep.id), "--optuna", "sqlite:///study.db", "--overwrite",
                      env=daemon.env, cwd=tmp_path)  # fmt: skip
    assert replaced.returncode == 0, replaced.stderr
    assert len(optuna.load_study(study_name=name, storage=storage).trials) == 3
    other = gpumux("export", str(sweep.id), "--optuna", "sqlite:///study.db", "--study-name",
                   "mine", env=daemon.env, cwd=tmp_path)  # fmt: skip
    assert other.returncode == 0, other.stderr
    assert set(optuna.study.get_all_study_names(storage)) == {name, "mine"}


def test_export_refuses_what_it_cannot_write_and_writes_nothing(
    daemon: Daemon, tmp_path: Path
) -> None:
    plain = run_sweep(daemon, tmp_path, "x=1,2")
    result = gpumux("export", str(plain.id), "--optuna", "sqlite:///study.db", env=daemon.env,
                    cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2
    assert f"sweep {plain.id} has no objective" in result.stderr
    assert "--objective METRIC:min" in result.stderr
    missing = gpumux("export", "999", "--optuna", "sqlite:///study.db", env=daemon.env,
                     cwd=tmp_path)  # fmt: skip
    assert missing.returncode == 1
    assert "sweep 999 not found" in missing.stderr
    assert not (tmp_path / "study.db").exists()

    scored = run_sweep(daemon, tmp_path, "x=1,2", objective="loss:min")
    nonsense = gpumux("export", str(scored.id), "--optuna", "study.db", env=daemon.env,
                      cwd=tmp_path)  # fmt: skip
    assert nonsense.returncode == 2
    assert "--optuna study.db: Optuna cannot open this storage" in nonsense.stderr
    assert "sqlite:///study.db" in nonsense.stderr
