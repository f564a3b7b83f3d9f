"""`gpumux sweep --config` and --search/--prune, as a user runs them against a real daemon."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from test_cli import Server, client, gpumux, server, wait_ended
from test_sweepfile import WANDB_CUSTOM_COMMAND, WANDB_RANDOM, WANDB_SWEEPDEMO

from gpumux.client import Client
from gpumux.status import SearchMethod, TrialStatus

__all__ = ["client", "server"]  # fixtures shared with test_cli
# The `train.py` of W&B's examples: prints the arguments it was given.
TRAIN = 'import json, sys\nprint("argv:", json.dumps(sys.argv[1:]))\n'


def user_env(server: Server) -> dict[str, str]:
    """The user's environment, where `python` (W&B's ${interpreter}) is this test's Python."""
    return server.env | {"PATH": f"{Path(sys.executable).parent}:{server.env['PATH']}"}


def project(tmp_path: Path, sweep_file: str) -> Path:
    """A directory holding W&B's train.py and the sweep file `sweep.yaml`."""
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "sweep.yaml").write_text(sweep_file)
    return tmp_path


def submitted(stdout: str, pattern: str = r"\d+ trials? queued") -> int:
    found = re.match(rf"sweep (\d+)(?: \([^)]*\))?: {pattern}\n", stdout)
    assert found, stdout
    return int(found.group(1))


def argv_in_log(client: Client, trial_id: int) -> list[str]:
    (line,) = [line for line in client.get_log(trial_id, 0).data.splitlines() if "argv:" in line]
    return list(json.loads(line.removeprefix("argv:")))


def test_a_sweep_file_from_wandbs_documentation_runs_unchanged(
    server: Server, client: Client, tmp_path: Path
) -> None:
    cwd = project(tmp_path, WANDB_CUSTOM_COMMAND)
    result = gpumux("sweep", "--config", "sweep.yaml", env=user_env(server), cwd=cwd)
    assert result.returncode == 0, result.stderr
    sweep_id = submitted(result.stdout, "1 trial queued")
    assert f"sweep {sweep_id} finished after" in result.stdout
    assert result.stderr == ""
    sweep = client.get_sweep(sweep_id)
    assert sweep.search is SearchMethod.grid
    assert sweep.params == ["batch_size=8", "lr=0.0001"]
    assert sweep.command == [
        "/usr/bin/env", "python", "train.py", "-b", "your-training-config",
        "--batch_size={batch_size}", "--lr={lr}",
    ]  # fmt: skip
    assert sweep.counts == {TrialStatus.succeeded: 1}
    (trial,) = client.all_trials(sweep_id)
    assert trial.params == {"batch_size": 8, "lr": 0.0001}
    # What W&B's agent runs: /usr/bin/env python train.py -b your-training-config ${args}
    expected = ["-b", "your-training-config", "--batch_size=8", "--lr=0.0001"]
    assert argv_in_log(client, trial.id) == expected


def test_a_random_sweep_file_draws_each_parameter_from_its_distribution(
    server: Server, client: Client, tmp_path: Path
) -> None:
    cwd = project(tmp_path, WANDB_RANDOM)
    # W&B's random search runs until stopped; gpumux's takes its budget from --trials.
    args = ("sweep", "--config", "sweep.yaml", "--trials", "4", "--seed", "3", "--detach")
    result = gpumux(*args, env=user_env(server), cwd=cwd)
    assert result.returncode == 0, result.stderr
    sweep_id = submitted(result.stdout, "4 trials queued")
    assert "parameters.batch_size: q_log_uniform_values becomes a choice of 29 values" in (
        result.stderr
    )
    sweep = wait_ended(client, sweep_id)
    assert (sweep.search, sweep.seed, str(sweep.objective)) == (SearchMethod.random, 3, "loss:min")
    assert sweep.counts == {TrialStatus.succeeded: 4}
    for trial in client.all_trials(sweep_id):
        values = trial.params
        assert values["batch_size"] in range(32, 257, 8)
        assert values["dropout"] in (0.3, 0.4, 0.5)
        assert values["epochs"] == 1
        assert values["fc_layer_size"] in (128, 256, 512)
        assert 0 <= values["learning_rate"] <= 0.1
        assert values["optimizer"] in ("adam", "sgd")
        flags = [f"--{name}={values[name]}" for name in values]
        assert sorted(argv_in_log(client, trial.id)) == sorted(flags)


def test_command_line_options_and_params_override_the_file(
    server: Server, client: Client, tmp_path: Path
) -> None:
    cwd = project(tmp_path, WANDB_CUSTOM_COMMAND)
    args = ("sweep", "--config", "sweep.yaml", "lr=0.5,0.25", "extra=1", "--name", "mine")
    result = gpumux(*args, "--detach", env=user_env(server), cwd=cwd)
    assert result.returncode == 0, result.stderr
    sweep = wait_ended(client, submitted(result.stdout, r"2 trials queued"))
    assert sweep.name == "mine"
    assert sweep.params == ["batch_size=8", "lr=0.5,0.25", "extra=1"]
    assert sweep.counts == {TrialStatus.succeeded: 2}
    argvs = sorted(argv_in_log(client, trial.id) for trial in client.all_trials(sweep.id))
    assert argvs == [
        ["-b", "your-training-config", "--batch_size=8", f"--lr={lr}", "--extra=1"]
        for lr in (0.25, 0.5)
    ]


def test_a_bayes_sweep_file_is_a_tpe_search_with_the_budget_it_is_given(
    server: Server, client: Client, tmp_path: Path
) -> None:
    cwd = project(tmp_path, WANDB_SWEEPDEMO)
    before = client.list_sweeps().count
    refused = gpumux("sweep", "--config", "sweep.yaml", env=user_env(server), cwd=cwd)
    assert refused.returncode == 2
    assert refused.stderr == (
        "error: sweep.yaml: run_cap: a tpe search needs a budget; add run_cap: K to the file, "
        "or --trials K\n"
    )
    assert client.list_sweeps().count == before
    args = ("sweep", "--config", "sweep.yaml", "--trials", "3", "--detach")
    result = gpumux(*args, env=user_env(server), cwd=cwd)
    assert result.returncode == 0, result.stderr
    sweep_id = submitted(result.stdout, "a tpe search of 3 trials")
    sweep = client.cancel_sweep(sweep_id)
    assert (sweep.name, sweep.search, sweep.trial_count) == ("sweepdemo", SearchMethod.tpe, 3)
    assert (sweep.metric, sweep.mode) == ("validation_loss", "min")
    assert sweep.params == [
        "learning_rate=0.0001..0.1:lin", "batch_size=16,32,64", "epochs=5,10,15",
        "optimizer=adam,sgd",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("sweep_file", "message"),
    [
        ("program: t.py\nmetric:\n  name: loss\n  target: 0.1\n",
         "sweep.yaml: metric.target: gpumux runs the whole budget and does not stop at a target"),
        ("program: t.py\nparameters:\n  lr:\n    distribution: normal\n",
         "sweep.yaml: parameters.lr.distribution: normal has no gpumux form"),
        ("program: t.py\ncommand: [python, '${program}', '${args_json}']\n",
         "sweep.yaml: command[2]: gpumux gives each trial its parameters as JSON"),
        ("program: t.py\nentity: me\nlaunch: true\n",
         "sweep.yaml: launch: not a sweep key gpumux reads"),
        ("program: t.py\nparameters:\n  lr: {values: [1, 2]\n",
         "sweep.yaml: line 4, column 1: malformed YAML"),
    ],
)  # fmt: skip
def test_a_key_gpumux_cannot_honour_is_refused_and_nothing_is_submitted(
    server: Server, client: Client, tmp_path: Path, sweep_file: str, message: str
) -> None:
    cwd = project(tmp_path, sweep_file)
    before = client.list_sweeps().count
    result = gpumux("sweep", "--config", "sweep.yaml", env=user_env(server), cwd=cwd)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: {message}")
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert client.list_sweeps().count == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prune", "bogus", "--objective", "loss:min"], "unknown pruner 'bogus'; use none,"),
        (["--prune", "median"], "--prune median compares trials on the objective: add --objective"),
        (["--search", "tpe", "--trials", "2"], "--search tpe learns from each trial's objective"),
        (["--search", "cmaes", "--trials", "2", "--objective", "loss:min"],
         "--search cmaes takes only numeric ranges, and y is a choice"),
        (["--search", "best"], "--search: Input should be 'grid', 'random', 'tpe'"),
        (["--prune", "asha:rungs=2", "--objective", "loss:min"], "asha has no option 'rungs'"),
    ],
)  # fmt: skip
def test_a_search_or_pruner_the_daemon_refuses_is_shown_with_its_reason(
    server: Server, client: Client, args: list[str], message: str
) -> None:
    before = client.list_sweeps().count
    result = gpumux("sweep", "x=1..4", "y=a,b", *args, "--", "python", "t.py", env=server.env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ")
    assert message in result.stderr
    assert client.list_sweeps().count == before


# A W&B program whose loss is its --x at every step: a larger x loses, and trains slower.
LOSS_IS_X = """
import json, sys, time
x = float(sys.argv[1].removeprefix("--x="))
for step in range(40):
    print("GPUMUX_REPORT " + json.dumps({"step": step, "loss": x}), flush=True)
    time.sleep(0.05 * x)
"""
HYPERBAND_FILE = """
program: train.py
method: grid
metric: {name: loss, goal: minimize}
parameters:
  x: {values: [1, 9]}
early_terminate: {type: hyperband, min_iter: 2, max_iter: 2, eta: 2}
"""


def test_a_wandb_hyperband_stops_the_losing_trial_at_min_iter(
    server: Server, client: Client, tmp_path: Path
) -> None:
    cwd = project(tmp_path, HYPERBAND_FILE)
    (cwd / "train.py").write_text(LOSS_IS_X)
    # One trial at a time, in the grid's order: the loser reaches step 2 after the winner.
    args = ("sweep", "--config", "sweep.yaml", "--split", "1", "--detach")
    result = gpumux(*args, env=user_env(server), cwd=cwd)
    assert result.returncode == 0, result.stderr
    sweep = wait_ended(client, submitted(result.stdout, "2 trials queued"))
    assert sweep.prune == "hyperband:min_resource=2,max_resource=2,reduction_factor=2"
    winner, loser = sorted(client.all_trials(sweep.id), key=lambda trial: trial.number)
    assert (winner.params, winner.status, winner.step) == ({"x": 1}, TrialStatus.succeeded, 39)
    # One bracket (min_iter = max_iter): its first rung, min_iter, is where the loser stops.
    assert (loser.params, loser.status) == ({"x": 9}, TrialStatus.pruned), loser
    assert loser.error is not None and loser.error.startswith(
        f"pruned at step 2 by the {sweep.prune} pruner (loss 9)"
    ), loser.error
    assert loser.step is not None and 2 <= loser.step < 39, loser


def test_search_and_prune_are_stored_as_given(
    server: Server, client: Client, tmp_path: Path
) -> None:
    args = ["--search", "random", "--trials", "2", "--prune", "median", "--objective", "loss:min"]
    result = gpumux(
        "sweep", "x=1..4", *args, "--detach", "--", sys.executable, "-c", "pass",
        env=server.env, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    sweep = wait_ended(client, submitted(result.stdout, "2 trials queued"))
    assert (sweep.search, sweep.prune, sweep.trial_count) == (SearchMethod.random, "median", 2)


def test_the_samplers_options_on_the_command_line_reach_the_daemon_and_gpumux_show(
    server: Server, client: Client, tmp_path: Path
) -> None:
    args = ["--search", "tpe:n_startup_trials=4,multivariate=false", "--trials", "2"]
    result = gpumux(
        "sweep", "x=1..4", *args, "--objective", "loss:min", "--detach",
        "--", sys.executable, "-c", "pass",
        env=server.env, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    sweep = client.cancel_sweep(submitted(result.stdout, "a tpe search of 2 trials"))
    assert sweep.search is SearchMethod.tpe
    assert sweep.search_options == {"n_startup_trials": 4, "multivariate": False}
    show = gpumux("show", str(sweep.id), env=server.env)
    assert "tpe:n_startup_trials=4,multivariate=false" in show.stdout, show.stdout
    refused = gpumux(
        "sweep", "x=1..4", "--search", "tpe:startup=4", "--trials", "2", "--objective",
        "loss:min", "--", sys.executable, "-c", "pass", env=server.env, cwd=tmp_path,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "--search tpe has no option 'startup'; its options: consider_prior," in refused.stderr
