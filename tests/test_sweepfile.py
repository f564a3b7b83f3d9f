"""W&B sweep files to gpumux sweeps: every distribution, macro and key, and every refusal."""

from __future__ import annotations

import json
import math
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from optuna.pruners import HyperbandPruner

from gpumux.grammar import sweepfile, sweepspec
from gpumux.grammar.command import render_command
from gpumux.grammar.sweepfile import SweepFile, SweepFileError
from gpumux.grammar.sweepfile.loading import MAX_FILE_BYTES, MAX_MESSAGE_CHARS
from gpumux.grammar.sweepplan import Objective
from gpumux.search import methods
from gpumux.status import ObjectiveMode, SearchMethod

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "sweeps"

# Copied verbatim from W&B's documentation, "Define a sweep configuration":
# https://docs.wandb.ai/guides/sweeps/define-sweep-configuration/ (wandb/docs,
# content/en/guides/models/sweeps/define-sweep-configuration/_index.md).
WANDB_SWEEPDEMO = """\
program: train.py
name: sweepdemo
method: bayes
metric:
  goal: minimize
  name: validation_loss
parameters:
  learning_rate:
    min: 0.0001
    max: 0.1
  batch_size:
    values: [16, 32, 64]
  epochs:
    values: [5, 10, 15]
  optimizer:
    values: ["adam", "sgd"]
"""
WANDB_RANDOM = """\
program: train.py
method: random
metric:
  goal: minimize
  name: loss
parameters:
  batch_size:
    distribution: q_log_uniform_values
    max: 256 
    min: 32
    q: 8
  dropout: 
    values: [0.3, 0.4, 0.5]
  epochs:
    value: 1
  fc_layer_size: 
    values: [128, 256, 512]
  learning_rate:
    distribution: uniform
    max: 0.1
    min: 0
  optimizer:
    values: ["adam", "sgd"]
"""  # noqa: W291 (the trailing spaces are W&B's)
WANDB_BAYES_HYPERBAND = """\
program: train.py
method: bayes
metric:
  goal: minimize
  name: val_loss
parameters:
  dropout:
    values: [0.15, 0.2, 0.25, 0.3, 0.4]
  hidden_layer_size:
    values: [96, 128, 148]
  layer_1_size:
    values: [10, 12, 14, 16, 18, 20]
  layer_2_size:
    values: [24, 28, 32, 36, 40, 44]
  learn_rate:
    values: [0.001, 0.01, 0.003]
  decay:
    values: [1e-5, 1e-6, 1e-7]
  momentum:
    values: [0.8, 0.9, 0.95]
  epochs:
    value: 27
early_terminate:
  type: hyperband
  s: 2
  eta: 3
  max_iter: 27
"""
# "How do I use custom CLI commands with sweeps?": https://docs.wandb.ai/support/custom_cli_commands_sweeps
WANDB_CUSTOM_COMMAND = """\
program:
  train.py
method: grid
parameters:
  batch_size:
    value: 8
  lr:
    value: 0.0001
command:
  - ${env}
  - python
  - ${program}
  - "-b"
  - your-training-config
  - ${args}
"""
# The same page's "Macro and custom command arguments example": its command names parameters
# (batch_size, optimizer) that its parameters do not define.
WANDB_MACRO_EXAMPLE = """\
program: run.py
method: random
metric:
  name: validation_loss
parameters:
  learning_rate:
    min: 0.0001
    max: 0.1
command:
  - ${env}
  - ${interpreter}
  - ${program}
  - "--batch_size=${batch_size}"
  - "--optimizer=${optimizer}"
  - "--test=True"
"""

ACC_MAX = Objective("acc", ObjectiveMode.max)


def from_yaml(text: str, **env: str) -> SweepFile:
    return sweepfile.parse(text, file="sweep.yaml", env=env)


def from_doc(doc: dict[str, Any], **env: str) -> SweepFile:
    return sweepfile.parse(json.dumps(doc), file="sweep.json", env=env, as_json=True)


def token_of(spec: dict[str, Any]) -> str:
    return from_doc({"parameters": {"x": spec}}).params["x"].text


def texts(sweep_file: SweepFile) -> dict[str, str]:
    """The file's parameters as the tokens the API is sent."""
    return {name: token.text for name, token in sweep_file.params.items()}


def refusal(doc: dict[str, Any] | str, key: str) -> str:
    """The message a sweep file is refused with, checked to name the file and `key`."""
    with pytest.raises(SweepFileError) as caught:
        from_yaml(doc) if isinstance(doc, str) else from_doc(doc)
    assert caught.value.key == key
    message = str(caught.value)
    assert message.startswith(f"{caught.value.file}: {key}: ")
    return message


def resolve(sweep_file: SweepFile, **given: Any) -> sweepfile.Resolved:
    options: dict[str, Any] = dict(
        tokens=[], command=None, search=None, trials=None, objective=None, prune=None, name=None
    )
    return sweepfile.resolve(sweep_file, **(options | given))


def run_argv(sweep_file: SweepFile, values: dict[str, sweepspec.Value]) -> list[str]:
    """The argv gpumux runs for a trial with these values."""
    return render_command(sweep_file.argv(list(sweep_file.params)), values)


@pytest.mark.parametrize(
    ("spec", "token"),
    [
        ({"value": 8}, "x=8"),
        ({"value": "adam"}, "x=adam"),
        ({"value": True}, "x=True"),
        ({"distribution": "constant", "value": 0.5}, "x=0.5"),
        ({"values": [16, 32, 64]}, "x=16,32,64"),
        ({"distribution": "categorical", "values": ["adam", "sgd"]}, "x=adam,sgd"),
        ({"values": [0.1, 1e-05, False]}, "x=0.1,1e-05,False"),
        ({"min": 2, "max": 6}, "x=2..6:lin"),
        # Uniform, as W&B's int_uniform is, where gpumux's own grammar would choose :log.
        ({"distribution": "int_uniform", "min": 1, "max": 100}, "x=1..100:lin"),
        ({"min": 0, "max": 0.1}, "x=0.0..0.1:lin"),
        ({"distribution": "uniform", "min": 1, "max": 100}, "x=1.0..100.0:lin"),
        ({"distribution": "log_uniform_values", "min": 1e-4, "max": 0.1}, "x=0.0001..0.1:log"),
        ({"distribution": "inv_log_uniform_values", "min": 1e-4, "max": 0.1}, "x=0.0001..0.1:log"),
        ({"distribution": "log_uniform", "min": 0, "max": 1}, f"x=1.0..{math.e!r}:log"),
        ({"distribution": "inv_log_uniform", "min": 0, "max": 1}, f"x={1 / math.e!r}..1.0:log"),
        ({"distribution": "q_uniform", "min": 0, "max": 10}, "x=0..10:lin"),
        ({"distribution": "q_uniform", "min": 0.5, "max": 3.5, "q": 1}, "x=1..3:lin"),
        ({"distribution": "q_uniform", "min": 0, "max": 1, "q": 0.25}, "x=0.0,0.25,0.5,0.75,1.0"),
        ({"distribution": "q_uniform", "min": 0, "max": 0.3, "q": 0.1}, "x=0.0,0.1,0.2,0.3"),
        ({"distribution": "q_uniform", "min": 1, "max": 22, "q": 5}, "x=5,10,15,20"),
        ({"distribution": "q_log_uniform_values", "min": 32, "max": 256}, "x=32..256:log"),
        ({"distribution": "q_log_uniform", "min": 0, "max": math.log(100)}, "x=1..100:log"),
    ],
)  # fmt: skip
def test_each_distribution_becomes_a_token_of_the_grammar(spec: dict[str, Any], token: str) -> None:
    assert token_of(spec) == token


def test_a_quantized_log_scale_is_a_choice_of_the_multiples_of_q_with_a_note() -> None:
    spec = {"distribution": "q_log_uniform_values", "min": 32, "max": 256, "q": 8}
    parsed = from_doc({"parameters": {"bs": spec}})
    assert parsed.params["bs"].param.values == tuple(range(32, 257, 8))
    (note,) = parsed.notes
    assert note == (
        "sweep.json: parameters.bs: q_log_uniform_values becomes a choice of 29 values, "
        "each as likely (W&B favours the small ones)"
    )


def test_whole_numbers_stay_whole_and_ranges_sample_inside_their_ends() -> None:
    """q 1 on a log scale is gpumux's own int log range: round(X) of a log-uniform X."""
    param = sweepspec.parse_param(
        token_of({"distribution": "q_log_uniform_values", "min": 32, "max": 256})
    )
    assert (param.kind, param.scale) == ("int", "log")
    log_range = sweepspec.parse_param(
        token_of({"distribution": "log_uniform", "min": -9, "max": -2})
    )
    assert (log_range.low, log_range.high) == (math.exp(-9), math.exp(-2))


@pytest.mark.parametrize(
    ("spec", "key", "fragments"),
    [
        ({"distribution": "normal", "mu": 1, "sigma": 0.5}, "parameters.x.distribution",
         ["normal has no gpumux form", "distribution: uniform, min: 0, max: 2 (mu ± 2 sigma)"]),
        ({"distribution": "q_normal"}, "parameters.x.distribution",
         ["q_normal has no gpumux form", "min: -2, max: 2"]),
        ({"distribution": "log_normal", "mu": 0, "sigma": 1}, "parameters.x.distribution",
         ["distribution: log_uniform_values, min: 0.1353, max: 7.389"]),
        ({"distribution": "beta", "a": 2, "b": 2}, "parameters.x.distribution",
         ["beta has no gpumux form", "distribution: uniform, min: 0, max: 1"]),
        ({"distribution": "gamma", "min": 1, "max": 2}, "parameters.x.distribution",
         ["unknown distribution 'gamma'; gpumux reads constant, categorical, int_uniform"]),
        ({"values": [1, 2], "probabilities": [0.9, 0.1]}, "parameters.x.probabilities",
         ["gpumux draws each value equally often; remove probabilities"]),
        ({"parameters": {"lr": {"value": 1}}}, "parameters.x.parameters",
         ["gpumux passes flat parameters", "optimizer_lr"]),
        ({"distribution": "uniform", "min": 0, "max": 1, "q": 0.1}, "parameters.x.q",
         ["uniform takes max, min, not q; remove it"]),
        ({"distribution": "uniform", "min": 0}, "parameters.x", ["uniform needs max"]),
        ({"mu": 0}, "parameters.x", ["give value, values, or min and max"]),
        ({"min": 5, "max": 1}, "parameters.x", ["min 5 is above max 1; swap them"]),
        ({"distribution": "log_uniform_values", "min": 0, "max": 1}, "parameters.x.min",
         ["a log scale needs min above 0, got 0"]),
        ({"distribution": "int_uniform", "min": 0.5, "max": 3}, "parameters.x",
         ["int_uniform takes whole numbers"]),
        ({"min": "low", "max": 3}, "parameters.x.min", ["expected a number, got 'low'"]),
        ({"distribution": "q_uniform", "min": 0, "max": 1000, "q": 0.01}, "parameters.x",
         ["100,001 multiples of q=0.01, over the 1,000 of a choice", "or use uniform (a range)"]),
        ({"distribution": "q_uniform", "min": 0.2, "max": 0.4, "q": 1.0}, "parameters.x",
         ["no multiple of q=1.0 lies between min 0.2 and max 0.4"]),
        ({"distribution": "q_uniform", "min": 0, "max": 1, "q": 0}, "parameters.x.q",
         ["q must be above 0"]),
        ({"values": ["a,b", "c"]}, "parameters.x", ["reads back as other values", "','"]),
        ({"values": ["1..2"]}, "parameters.x", ["'x=1..2' reads back as other values"]),
        ({"values": ["a..b"]}, "parameters.x",
         ["gpumux cannot write this as a parameter: x=a..b: range ends must be numbers"]),
        ({"values": [None]}, "parameters.x", ["a number, text or true/false, not None"]),
        ({"values": []}, "parameters.x.values", ["a non-empty list"]),
        ({"value": float("inf")}, "parameters.x", ["inf is not a finite number"]),
        ({"distribution": ["uniform"]}, "parameters.x.distribution", ["a distribution's name"]),
        (8, "parameters.x", ["expected a mapping"]),
    ],
)  # fmt: skip
def test_a_parameter_gpumux_cannot_honour_is_refused_with_the_fix(
    spec: Any, key: str, fragments: list[str]
) -> None:
    message = refusal({"parameters": {"x": spec}}, key)
    for fragment in fragments:
        assert fragment in message


def test_a_name_the_grammar_refuses_is_refused_with_a_new_name() -> None:
    message = refusal(
        {"parameters": {"optimizer.config.lr": {"value": 1}}}, "parameters.optimizer.config.lr"
    )
    assert "rename it, e.g. optimizer_config_lr" in message
    # Its name is what to change, not its value (the token lr=b=1 reads back as lr: "b=1").
    assert "rename it, e.g. lr_b" in refusal(
        {"parameters": {"lr=b": {"value": 1}}}, "parameters.lr=b"
    )


def test_yaml_reads_1e_5_as_text_and_gpumux_reads_it_as_the_number() -> None:
    parsed = from_yaml(
        "parameters:\n  lr:\n    min: 1e-5\n    max: 1e-1\n  d:\n    values: [1e-5]\n"
    )
    assert texts(parsed) == {"lr": "lr=1e-05..0.1:lin", "d": "d=1e-5"}
    assert parsed.params["d"].param.values == (1e-05,)


@pytest.mark.parametrize(
    ("method", "search"),
    [("grid", SearchMethod.grid), ("random", SearchMethod.random), ("bayes", SearchMethod.tpe)],
)
def test_the_method_is_a_search(method: str, search: SearchMethod) -> None:
    assert from_doc({"method": method}).search is search


@pytest.mark.parametrize(
    ("doc", "key", "fragment"),
    [
        ({"method": "custom"}, "method", "'custom': gpumux reads grid, random or bayes"),
        ({"method": "tpe"}, "method", "'tpe' is gpumux's, not W&B's; use --search tpe"),
        ({"metric": {"name": "loss", "target": 0.1}}, "metric.target", "remove target"),
        ({"metric": {"name": "loss", "impute": "worst"}}, "metric.impute", "does not impute"),
        ({"metric": {"name": "loss", "goal": "lowest"}}, "metric.goal", "minimize or maximize"),
        ({"metric": {"goal": "minimize"}}, "metric.name", "e.g. name: val_loss"),
        ({"metrics": [{"name": "a"}, {"name": "b"}]}, "metrics", "one metric"),
        ({"scheduler": {"engine": "optuna"}}, "scheduler", "--search tpe|gp|cmaes|qmc"),
        ({"job": "me/proj/job:v0"}, "job", "give program: (or command:) instead"),
        ({"run_cap": 0}, "run_cap", "a whole number of trials, 1 or more; got 0"),
        ({"program": 3}, "program", "expected text, got 3"),
        ({"name": "n" * 201}, "name", "at most 200 characters"),
        ({"paramters": {}}, "paramters", "not a sweep key gpumux reads (program, command,"),
    ],
)
def test_a_key_gpumux_does_not_honour_is_refused_by_name(
    doc: dict[str, Any], key: str, fragment: str
) -> None:
    assert fragment in refusal(doc, key)


def test_metadata_is_accepted_with_a_note_each() -> None:
    doc = {"project": "p", "entity": "e", "description": "d", "controller": {"type": "local"}}
    notes = from_doc(doc).notes
    assert notes == (
        "sweep.json: project is W&B's, nothing changes: gpumux keeps no W&B projects",
        "sweep.json: entity is W&B's, nothing changes: gpumux keeps no W&B entities",
        "sweep.json: description is W&B's, nothing changes: gpumux keeps the sweep's name only "
        "(name: or --name)",
        "sweep.json: controller is W&B's, nothing changes: gpumux's daemon is the controller",
    )


def test_the_metric_is_the_objective_and_minimize_the_default_goal() -> None:
    assert from_doc({"metric": {"name": "acc", "goal": "maximize"}}).objective == ACC_MAX
    assert from_doc({"metric": {"name": "val_loss"}}).objective == ("val_loss", ObjectiveMode.min)


@pytest.mark.parametrize(
    ("spec", "prune"),
    [
        ({"min_iter": 3}, "hyperband:min_resource=3,reduction_factor=3"),
        ({"min_iter": 2, "eta": 2}, "hyperband:min_resource=2,reduction_factor=2"),
        ({"min_iter": 1, "max_iter": 81, "eta": 3.0},
         "hyperband:min_resource=1,max_resource=81,reduction_factor=3"),
        # W&B's brackets for max_iter 27, s 2, eta 3 are [3, 9]: the first is at step 3.
        ({"max_iter": 27, "s": 2, "eta": 3},
         "hyperband:min_resource=3,max_resource=27,reduction_factor=3"),
        # s past 1 step stops where W&B's brackets stop: 10 / 3 = 3, 10 / 9 = 1.
        ({"max_iter": 10, "s": 5}, "hyperband:min_resource=1,max_resource=10,reduction_factor=3"),
    ],
)  # fmt: skip
def test_hyperband_is_optunas_hyperband_pruner(spec: dict[str, Any], prune: str) -> None:
    parsed = from_doc({"early_terminate": {"type": "hyperband", **spec}})
    assert parsed.prune == prune
    pruner_spec = methods.parse_prune(prune)
    assert pruner_spec is not None
    assert isinstance(methods.make_pruner(pruner_spec), HyperbandPruner)


@pytest.mark.parametrize(
    ("spec", "key", "fragment"),
    [
        ({"type": "envelope"}, "early_terminate.type", "'envelope': gpumux reads type: hyperband"),
        ({"type": "hyperband", "min_iter": 3, "strict": True}, "early_terminate.strict",
         "no strict mode"),
        ({"type": "hyperband", "min_iter": 3, "eta": 1.5}, "early_terminate.eta",
         "Optuna's reduction factor is a whole number, 2 or more; got 1.5"),
        ({"type": "hyperband", "s": 2}, "early_terminate.s", "give max_iter with s"),
        ({"type": "hyperband", "min_iter": 3, "max_iter": 27, "s": 2}, "early_terminate.s",
         "or min_iter alone"),
        ({"type": "hyperband", "max_iter": 2, "s": 1}, "early_terminate.max_iter",
         "2 / eta is below 1"),
        ({"type": "hyperband", "eta": 3}, "early_terminate", "give min_iter"),
        ({"type": "hyperband", "min_iter": 9, "max_iter": 3}, "early_terminate.min_iter",
         "9 is above max_iter 3"),
        ({"type": "hyperband", "min_iter": 0}, "early_terminate.min_iter", "1 or more; got 0"),
        ({"type": "hyperband", "min_iter": 3, "bands": 2}, "early_terminate.bands",
         "not a hyperband key"),
    ],
)  # fmt: skip
def test_early_termination_gpumux_cannot_run_is_refused(
    spec: dict[str, Any], key: str, fragment: str
) -> None:
    assert fragment in refusal({"early_terminate": spec}, key)


def test_without_a_command_the_program_runs_as_wandbs_agent_runs_it() -> None:
    parsed = from_doc({"program": "train.py", "parameters": {"lr": {"value": 0.1}}})
    assert parsed.command == ("/usr/bin/env", "python", "train.py", "${args}")
    assert run_argv(parsed, {"lr": 0.1}) == ["/usr/bin/env", "python", "train.py", "--lr=0.1"]


def test_the_args_macros_place_every_parameter_where_they_stand() -> None:
    command = ["${interpreter}", "${program}", "${args_no_hyphens}", "--", "${args}", "tail"]
    params = {"lr": {"value": 0.5}, "opt": {"values": ["adam", "sgd"]}}
    parsed = from_doc({"program": "t.py", "command": command, "parameters": params})
    assert run_argv(parsed, {"lr": 0.5, "opt": "sgd"}) == [
        "python", "t.py", "lr=0.5", "opt=sgd", "--", "--lr=0.5", "--opt=sgd", "tail",
    ]  # fmt: skip


def test_parameter_and_environment_macros_inside_a_word() -> None:
    command = ["${program}", "--data=${envvar:DATA}/x", "--bs=${bs}", "${args_no_boolean_flags}"]
    parsed = from_doc(
        {"program": "t.py", "command": command, "parameters": {"bs": {"value": 8}}},
        DATA="/srv/data",
    )
    assert parsed.command == ("t.py", "--data=/srv/data/x", "--bs={bs}", "${args_no_boolean_flags}")
    assert run_argv(parsed, {"bs": 8}) == ["t.py", "--data=/srv/data/x", "--bs=8", "--bs=8"]
    assert parsed.notes == ()


def test_a_command_without_args_is_noted_since_gpumux_appends_them() -> None:
    parsed = from_doc(
        {
            "command": ["./train.sh", "--bs=${bs}"],
            "parameters": {"bs": {"value": 8}, "lr": {"value": 0.1}, "wd": {"value": 0}},
        }
    )
    assert run_argv(parsed, {"bs": 8, "lr": 0.1, "wd": 0}) == [
        "./train.sh", "--bs=8", "--lr=0.1", "--wd=0",
    ]  # fmt: skip
    assert parsed.notes == (
        "sweep.json: command has no ${args}: gpumux appends --NAME=VALUE for lr, wd (W&B passes "
        "them only to wandb.config); each trial also finds its parameters as JSON in "
        "GPUMUX_PARAMS",
    )


@pytest.mark.parametrize(
    ("word", "fragment"),
    [
        ("${args_json}", "as JSON in the environment variable GPUMUX_PARAMS"),
        ("${args_json_file}", "json.loads(os.environ['GPUMUX_PARAMS'])"),
        ("--all=${args}", "${args} is one word per parameter: a list item of its own"),
        ("${envvar:NOT_SET_HERE}", "NOT_SET_HERE is not set in this environment"),
        ("${bs}", "${bs} is neither a W&B macro (env, interpreter, program, args,"),
        ("{flag}", "gpumux would fill {flag} with the parameter, W&B would not"),
        ("${args_no_boolean_flags}", "cannot leave out a false flag (flag); use ${args}"),
        (3, "3 is not text; quote it: '3'"),
    ],
)
def test_a_macro_gpumux_cannot_expand_is_refused(word: Any, fragment: str) -> None:
    doc = {
        "program": "t.py",
        "command": ["t.py", word],
        "parameters": {"flag": {"values": [True, False]}},
    }
    assert fragment in refusal(doc, "command[1]")


def test_program_macro_without_a_program_is_refused() -> None:
    assert "add program: train.py" in refusal({"command": ["python", "${program}"]}, "command[1]")


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        ("method: grid\nparameters:\n  lr: [1, 2\n", "line 4, column 1", "malformed YAML"),
        ("method: grid\nmethod: random\n", "line 2, column 1",
         "the key 'method' is given twice; keep one"),
        ("parameters:\n  lr:\n    value: 1\n  lr:\n    value: 2\n", "line 4, column 3",
         "'lr' is given twice"),
    ],
)  # fmt: skip
def test_malformed_yaml_is_refused_with_its_line_and_column(
    text: str, key: str, fragment: str
) -> None:
    assert fragment in refusal(text, key)


def test_yaml_aliases_are_refused_before_they_expand() -> None:
    # Nested aliases, each level nine of the last: 9**10 values from a few hundred bytes.
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 10):
        levels.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]")
    bomb = "method: grid\n" + "\n".join(levels) + "\nparameters:\n  lr: *a9\n"
    message = refusal(bomb, "line 3, column 10")
    assert "the alias *a0 is not taken in a sweep file; write its value out" in message


def test_an_anchor_alone_is_read() -> None:
    doc = "method: grid\nparameters:\n  lr: &lr\n    values: [1, 2]\n"
    assert texts(from_yaml(doc)) == {"lr": "lr=1,2"}


def test_a_refusal_quoting_a_long_value_stays_one_short_line() -> None:
    word = "${" + "x" * 100_000 + "}"
    message = refusal({"program": "t.py", "command": ["t.py", word]}, "command[1]")
    assert len(message) <= MAX_MESSAGE_CHARS + 1
    assert message.endswith("…")


def test_json_is_read_and_its_errors_placed() -> None:
    assert texts(from_doc({"method": "grid", "parameters": {"x": {"values": [1, 2]}}})) == {
        "x": "x=1,2"
    }
    with pytest.raises(SweepFileError, match=r"^s\.json: line 2, column 1: malformed JSON: "):
        sweepfile.parse('{"method": "grid",\n}', file="s.json", env={}, as_json=True)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "sweep.yaml: the file is empty; write method:, parameters: and program:"),
        (
            "- method: grid\n",
            "sweep.yaml: expected a mapping of keys (method, parameters, program)",
        ),
    ],
)
def test_a_file_that_is_not_a_mapping_is_refused(text: str, message: str) -> None:
    with pytest.raises(SweepFileError) as caught:
        from_yaml(text)
    assert str(caught.value) == message


def test_reading_a_missing_file_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SweepFileError) as caught:
        sweepfile.read(missing, env={})
    assert str(caught.value) == f"{missing}: cannot read it: No such file or directory"


def test_the_command_line_overrides_the_file() -> None:
    parsed = from_yaml(WANDB_BAYES_HYPERBAND)
    resolved = resolve(
        parsed,
        tokens=["epochs=3", "seed=1,2"],
        search="random",
        trials=4,
        objective=ACC_MAX,
        prune="none",
        name="quick",
    )
    assert resolved.params[-2:] == ["epochs=3", "seed=1,2"]
    assert resolved.params[:2] == ["dropout=0.15,0.2,0.25,0.3,0.4", "hidden_layer_size=96,128,148"]
    # The file's command places the parameters: the one added on the command line too.
    assert resolved.command[-2:] == ["--epochs={epochs}", "--seed={seed}"]
    chosen = (resolved.search, resolved.trials, resolved.objective, resolved.prune, resolved.name)
    assert chosen == ("random", 4, ACC_MAX, "none", "quick")
    with pytest.raises(sweepspec.SpecError, match="lr given twice"):
        resolve(parsed, tokens=["lr=1", "lr=2"], trials=2)
    replaced = resolve(parsed, command=["./run.sh"], trials=2)
    assert replaced.command == ["./run.sh"]
    assert (replaced.search, replaced.prune) == (SearchMethod.tpe, parsed.prune)


def test_each_token_is_parsed_once_the_files_as_it_is_read_the_command_lines_as_resolved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsed: list[str] = []
    parse = sweepspec.parse_param

    def counted(token: str) -> sweepspec.Param:
        parsed.append(token)
        return parse(token)

    monkeypatch.setattr(sweepspec, "parse_param", counted)
    sweep_file = from_yaml(WANDB_SWEEPDEMO)
    assert parsed == list(texts(sweep_file).values())
    parsed.clear()
    resolved = resolve(sweep_file, tokens=["epochs=3", "seed=1,2"], trials=5)
    assert parsed == ["epochs=3", "seed=1,2"]
    assert resolved.params[2:] == ["epochs=3", "optimizer=adam,sgd", "seed=1,2"]
    # A grid under run_cap is counted from the tokens as parsed, not parsed again.
    grid = from_doc(
        {
            "method": "grid",
            "program": "t.py",
            "run_cap": 6,
            "parameters": {"x": {"values": [1, 2, 3]}},
        }
    )
    parsed.clear()
    assert resolve(grid, tokens=["y=1,2"]).params == ["x=1,2,3", "y=1,2"]
    assert parsed == ["y=1,2"]


def test_too_many_parameters_with_the_command_lines_name_the_file_and_key() -> None:
    many = {f"p{n}": {"value": n} for n in range(250)}
    parsed = from_doc({"program": "t.py", "parameters": many})
    extra = [f"q{n}=1" for n in range(sweepspec.MAX_PARAMS - 250 + 1)]
    with pytest.raises(SweepFileError) as caught:
        resolve(parsed, tokens=extra)
    assert str(caught.value) == (
        f"sweep.json: parameters: {sweepspec.MAX_PARAMS + 1} parameters, over the limit of "
        f"{sweepspec.MAX_PARAMS}; sweep fewer, or pass the constant ones in the command"
    )
    assert len(resolve(parsed, tokens=extra[1:]).params) == sweepspec.MAX_PARAMS


def test_a_search_that_needs_a_budget_asks_for_run_cap() -> None:
    message = (
        "sweep.yaml: run_cap: a tpe search needs a budget; add run_cap: K to the file, "
        "or --trials K"
    )
    with pytest.raises(SweepFileError) as caught:
        resolve(from_yaml(WANDB_SWEEPDEMO))
    assert str(caught.value) == message
    assert resolve(from_yaml(WANDB_SWEEPDEMO + "run_cap: 7\n")).trials == 7
    with pytest.raises(SweepFileError, match="run_cap: a random search needs a budget"):
        resolve(from_yaml(WANDB_CUSTOM_COMMAND), search="random")
    # The sampler's options after the method: the method still asks for its budget.
    with pytest.raises(SweepFileError, match="run_cap: a tpe search needs a budget"):
        resolve(from_yaml(WANDB_CUSTOM_COMMAND), search="tpe:n_startup_trials=4")
    kept = resolve(from_yaml(WANDB_SWEEPDEMO), search="TPE:n_startup_trials=4", trials=8)
    assert (kept.search, kept.trials) == ("TPE:n_startup_trials=4", 8)


def test_run_cap_on_a_grid_holds_only_if_the_whole_grid_fits() -> None:
    doc = {"method": "grid", "program": "t.py", "parameters": {"x": {"values": [1, 2, 3]}}}
    assert resolve(from_doc(doc | {"run_cap": 3})).trials is None
    with pytest.raises(SweepFileError, match="run_cap: the grid has 3 points; raise or remove"):
        resolve(from_doc(doc | {"run_cap": 2}))


def test_a_grid_over_a_continuous_range_is_refused_unless_the_command_line_lists_it() -> None:
    parsed = from_doc(
        {"method": "grid", "program": "t.py", "parameters": {"lr": {"min": 0.1, "max": 1.0}}}
    )
    with pytest.raises(SweepFileError) as caught:
        resolve(parsed)
    assert caught.value.key == "parameters.lr"
    assert "method: grid cannot list a continuous range (W&B refuses it too)" in str(caught.value)
    assert resolve(parsed, tokens=["lr=0.1,1.0"]).params == ["lr=0.1,1.0"]
    assert resolve(parsed, search="random", trials=3).trials == 3


def test_stopping_needs_a_metric_from_the_file_or_the_command_line() -> None:
    doc = {"program": "t.py", "run_cap": 2, "early_terminate": {"type": "hyperband", "min_iter": 1}}
    with pytest.raises(SweepFileError, match="early_terminate: stopping compares a metric; add"):
        resolve(from_doc(doc))
    assert (
        resolve(from_doc(doc), objective=Objective("loss", ObjectiveMode.min)).prune
        == "hyperband:min_resource=1,reduction_factor=3"
    )
    assert resolve(from_doc(doc), prune="none").prune == "none"


def test_nothing_to_run_is_refused_unless_the_command_line_gives_a_command() -> None:
    parsed = from_doc({"parameters": {"x": {"value": 1}}})
    with pytest.raises(SweepFileError, match="program: nothing to run; add program: train.py"):
        resolve(parsed)
    assert resolve(parsed, command=["./run.sh"]).command == ["./run.sh"]


def test_wandbs_documented_sweeps_read_as_wandb_means_them() -> None:
    demo = resolve(from_yaml(WANDB_SWEEPDEMO), trials=5)
    assert demo.params == [
        "learning_rate=0.0001..0.1:lin", "batch_size=16,32,64", "epochs=5,10,15",
        "optimizer=adam,sgd",
    ]  # fmt: skip
    assert (demo.search, demo.objective, demo.name) == (
        SearchMethod.tpe, ("validation_loss", ObjectiveMode.min), "sweepdemo",
    )  # fmt: skip
    hyperband = from_yaml(WANDB_BAYES_HYPERBAND)
    assert hyperband.prune == "hyperband:min_resource=3,max_resource=27,reduction_factor=3"
    checked = methods.check(
        method=hyperband.search,
        prune=hyperband.prune,
        trials=27,
        metric=hyperband.objective.metric if hyperband.objective else None,
        params=[token.param for token in hyperband.params.values()],
    )
    assert checked.method is SearchMethod.tpe
    custom = resolve(from_yaml(WANDB_CUSTOM_COMMAND))
    values = {"batch_size": 8, "lr": 0.0001}
    assert render_command(custom.command, values) == [
        "/usr/bin/env", "python", "train.py", "-b", "your-training-config", "--batch_size=8",
        "--lr=0.0001",
    ]  # fmt: skip
    random = resolve(from_yaml(WANDB_RANDOM), trials=3)
    assert random.params[0] == "batch_size=" + ",".join(str(n) for n in range(32, 257, 8))
    assert "learning_rate=0.0..0.1:lin" in random.params


def test_wandbs_macro_example_names_parameters_it_does_not_define() -> None:
    message = refusal(WANDB_MACRO_EXAMPLE, "command[3]")
    assert "${batch_size} is neither a W&B macro" in message


@pytest.mark.parametrize("example", ["digits_bayes_hyperband.yaml", "digits_random.yaml"])
def test_the_example_sweep_files_are_accepted_as_the_daemon_checks_them(example: str) -> None:
    parsed = sweepfile.read(EXAMPLES / example, env={})
    resolved = resolve(parsed)
    assert parsed.notes == ()
    assert resolved.command[:3] == ["/usr/bin/env", "python", "examples/digits_keras.py"]
    assert (ROOT / resolved.command[2]).is_file()
    search = methods.check(
        method=SearchMethod(resolved.search or "grid"),
        prune=resolved.prune,
        trials=resolved.trials,
        metric=resolved.objective.metric if resolved.objective else None,
        params=sweepspec.parse_params(resolved.params),
    )
    assert search.method in (SearchMethod.tpe, SearchMethod.random)


def test_a_device_or_an_endless_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    with pytest.raises(SweepFileError, match="not a regular file"):
        sweepfile.read("/dev/zero", env={})
    huge = tmp_path / "huge.yaml"
    huge.write_text("# " + "x" * MAX_FILE_BYTES + "\n")
    with pytest.raises(SweepFileError, match="over 1,024 KiB"):
        sweepfile.read(huge, env={})


def test_a_fifo_is_read_once_its_writer_comes(tmp_path: Path) -> None:
    fifo = tmp_path / "sweep.yaml"
    os.mkfifo(fifo)

    def write() -> None:
        # Opening for writing waits for the reader: no sleep orders the two.
        fifo.write_text("program: train.py\nparameters:\n  lr:\n    values: [0.1]\n")

    writer = threading.Thread(target=write)
    writer.start()
    sweep_file = sweepfile.read(fifo, env={})
    writer.join()
    assert texts(sweep_file) == {"lr": "lr=0.1"}


def test_a_pipe_with_a_writer_is_read(tmp_path: Path) -> None:
    reading, writing = os.pipe()
    os.write(writing, b"program: train.py\nparameters:\n  lr:\n    values: [0.1, 0.2]\n")
    os.close(writing)
    with os.fdopen(reading):
        sweep_file = sweepfile.read(f"/dev/fd/{reading}", env={})
    assert texts(sweep_file) == {"lr": "lr=0.1,0.2"}
