"""A sweep file's top-level keys, each read by one method of `Reader`, into a `SweepFile`."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumux.grammar import sweepspec
from gpumux.grammar.sweepfile.loading import SweepFileError, load, read_text
from gpumux.grammar.sweepfile.parameters import CONTINUOUS, Parameter
from gpumux.grammar.sweepplan import Objective
from gpumux.status import ObjectiveMode, SearchMethod

METHODS = {"grid": SearchMethod.grid, "random": SearchMethod.random, "bayes": SearchMethod.tpe}
GOALS = {"minimize": "min", "maximize": "max"}
# W&B's agent runs this when the file gives a program and no command.
DEFAULT_COMMAND = ("${env}", "${interpreter}", "${program}", "${args}")
# As W&B's agent does: the trial runs with the submitter's PATH, so `python` is the one their
# shell finds (their virtualenv's), not the interpreter gpumux itself happens to run on.
MACROS = {"env": "/usr/bin/env", "interpreter": "python"}
# Macros that stand for one word per parameter; `{name}` is the grammar's placeholder.
ARGS_MACROS: dict[str, Callable[[str], str]] = {
    "${args}": lambda name: f"--{name}={{{name}}}",
    "${args_no_boolean_flags}": lambda name: f"--{name}={{{name}}}",
    "${args_no_hyphens}": lambda name: f"{name}={{{name}}}",
}
READ_PARAMS_JSON = (
    "gpumux gives each trial its parameters as JSON in the environment variable GPUMUX_PARAMS: "
    "read json.loads(os.environ['GPUMUX_PARAMS']) in the program and remove this macro"
)
# Keys that change nothing that runs: accepted, each with a note the CLI prints.
METADATA = {
    "project": "gpumux keeps no W&B projects",
    "entity": "gpumux keeps no W&B entities",
    "description": "gpumux keeps the sweep's name only (name: or --name)",
    "controller": "gpumux's daemon is the controller",
}
REFUSED = {
    "job": "W&B Launch jobs do not run on gpumux; give program: (or command:) instead",
    "image_uri": "W&B Launch images do not run on gpumux; give program: (or command:) instead",
    "scheduler": "custom schedulers are W&B's; use method: bayes, or --search tpe|gp|cmaes|qmc",
    "metrics": "gpumux optimises one metric; give metric: {name: ..., goal: ...}",
}
METRIC_REFUSED = {
    "target": "gpumux runs the whole budget and does not stop at a target; remove target",
    "impute": "gpumux does not impute: a failed trial counts as failed; remove impute",
    "impute_while_running": "gpumux does not impute running trials; remove impute_while_running",
}
HYPERBAND_KEYS = ("type", "min_iter", "max_iter", "s", "eta")
KEYS = (
    "program", "command", "method", "metric", "parameters", "early_terminate", "run_cap", "name",
    *METADATA,
)  # fmt: skip
_MACRO = re.compile(r"\$\{([^}]*)\}")
_BRACES = re.compile(r"\{([A-Za-z_][A-Za-z0-9_-]*)\}")


@dataclass(frozen=True)
class SweepFile:
    """A sweep file as gpumux reads it; `argv(names)` is its command for those parameters."""

    file: str
    params: dict[str, sweepspec.Token]  # name -> its token, parsed, in the file's order
    command: tuple[str, ...]  # empty when the file gives neither program nor command
    search: SearchMethod | None = None
    trials: int | None = None
    objective: Objective | None = None
    prune: str | None = None
    name: str | None = None
    continuous: frozenset[str] = frozenset()  # float ranges, which a grid cannot list
    notes: tuple[str, ...] = ()

    def argv(self, names: Sequence[str]) -> list[str]:
        """The command, each args macro expanded to one placeholder word per parameter."""
        words: list[str] = []
        for word in self.command:
            form = ARGS_MACROS.get(word)
            words += [form(name) for name in names] if form else [word]
        return words


def read(path: str | Path, *, env: Mapping[str, str]) -> SweepFile:
    """Read the sweep file at `path` (JSON when it ends in .json, else YAML)."""
    file = str(path)
    return parse(read_text(file), file=file, env=env, as_json=file.endswith(".json"))


def parse(text: str, *, file: str, env: Mapping[str, str], as_json: bool = False) -> SweepFile:
    """A sweep file's text as gpumux runs it; `${envvar:NAME}` takes its value from `env`."""
    doc = load(text, file=file, as_json=as_json)
    if doc is None:
        raise SweepFileError(file, "", "the file is empty; write method:, parameters: and program:")
    if not isinstance(doc, dict):
        raise SweepFileError(file, "", "expected a mapping of keys (method, parameters, program)")
    return Reader(file, env).sweep(doc)


class Reader:
    """Reads one file's keys, one method each; `notes` collects what the CLI prints."""

    def __init__(self, file: str, env: Mapping[str, str]) -> None:
        self.file = file
        self.env = env
        self.notes: list[str] = []
        self.booleans: set[str] = set()

    def error(self, key: str, problem: str) -> SweepFileError:
        return SweepFileError(self.file, key, problem)

    def sweep(self, doc: dict[Any, Any]) -> SweepFile:
        """The whole file; every key is read, noted as metadata, or refused."""
        for key in doc:
            if key in METADATA:
                self.notes.append(f"{self.file}: {key} is W&B's, nothing changes: {METADATA[key]}")
            elif key in REFUSED:
                raise self.error(key, REFUSED[key])
            elif key not in KEYS:
                raise self.error(str(key), f"not a sweep key gpumux reads ({', '.join(KEYS)})")
        params, continuous = self.parameters(doc.get("parameters"))
        command = self.command(doc.get("command"), self.text(doc, "program"), params)
        return SweepFile(
            file=self.file,
            params=params,
            command=command,
            search=self.method(doc.get("method")),
            trials=self.run_cap(doc.get("run_cap")),
            objective=self.metric(doc.get("metric")),
            prune=self.early_terminate(doc.get("early_terminate")),
            name=self.text(doc, "name"),
            continuous=frozenset(continuous),
            notes=tuple(self.notes),
        )

    def text(self, doc: dict[Any, Any], key: str) -> str | None:
        value = doc.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise self.error(key, f"expected text, got {value!r}")
        if key == "name" and value is not None and len(value) > 200:
            raise self.error(key, "at most 200 characters; shorten it")
        return value

    def method(self, value: Any) -> SearchMethod | None:
        if value is None:
            return None
        if isinstance(value, str) and value in METHODS:
            return METHODS[value]
        if isinstance(value, str) and value in list(SearchMethod):
            raise self.error("method", f"{value!r} is gpumux's, not W&B's; use --search {value}")
        raise self.error("method", f"{value!r}: gpumux reads grid, random or bayes (or --search)")

    def run_cap(self, value: Any) -> int | None:
        if value is not None and (type(value) is not int or value < 1):
            problem = f"expected a whole number of trials, 1 or more; got {value!r}"
            raise self.error("run_cap", problem)
        return value

    def metric(self, spec: Any) -> Objective | None:
        if spec is None:
            return None
        if not isinstance(spec, dict):
            raise self.error("metric", "expected {name: val_loss, goal: minimize}")
        for key in spec:
            if key in METRIC_REFUSED:
                raise self.error(f"metric.{key}", METRIC_REFUSED[key])
            if key not in ("name", "goal"):
                raise self.error(f"metric.{key}", "not a metric key gpumux reads (name, goal)")
        name, goal = spec.get("name"), spec.get("goal", "minimize")
        if not isinstance(name, str) or not name.strip():
            raise self.error("metric.name", "the metric's name is needed, e.g. name: val_loss")
        if not isinstance(goal, str) or goal not in GOALS:
            raise self.error("metric.goal", f"{goal!r}: expected minimize or maximize")
        return Objective(name, ObjectiveMode(GOALS[goal]))

    def early_terminate(self, spec: Any) -> str | None:
        """Hyperband's brackets as Optuna's HyperbandPruner options."""
        if spec is None:
            return None
        key = "early_terminate"
        if not isinstance(spec, dict) or spec.get("type") != "hyperband":
            got = spec.get("type") if isinstance(spec, dict) else spec
            raise self.error(f"{key}.type", f"{got!r}: gpumux reads type: hyperband")
        for sub in spec:
            if sub == "strict":
                raise self.error(f"{key}.strict", "Optuna's pruner has no strict mode; remove it")
            if sub not in HYPERBAND_KEYS:
                known = ", ".join(HYPERBAND_KEYS)
                raise self.error(f"{key}.{sub}", f"not a hyperband key ({known})")
        eta = self.whole(spec, "eta", low=2, default=3)
        min_iter = self.whole(spec, "min_iter", low=1)
        max_iter = self.whole(spec, "max_iter", low=1)
        brackets = self.whole(spec, "s", low=1)
        if brackets is not None:
            if max_iter is None or min_iter is not None:
                fix = "give max_iter with s, or min_iter alone"
                raise self.error(f"{key}.s", f"s counts brackets down from max_iter; {fix}")
            min_iter = self.lowest_band(max_iter, eta, brackets)
        if min_iter is None:
            raise self.error(key, "give min_iter (the first step compared), or max_iter with s")
        if max_iter is not None and min_iter > max_iter:
            raise self.error(f"{key}.min_iter", f"{min_iter} is above max_iter {max_iter}")
        options = [f"min_resource={min_iter}", f"reduction_factor={eta}"]
        if max_iter is not None:
            options.insert(1, f"max_resource={max_iter}")
        return "hyperband:" + ",".join(options)

    def whole(self, spec: dict[str, Any], key: str, *, low: int, default: int | None = None) -> Any:
        value = spec.get(key, default)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if value is not None and (type(value) is not int or value < low):
            what = "Optuna's reduction factor is " if key == "eta" else ""
            problem = f"{what}a whole number, {low} or more; got {value!r}"
            raise self.error(f"early_terminate.{key}", problem)
        return value

    def lowest_band(self, max_iter: int, eta: int, brackets: int) -> int:
        """W&B's first bracket for max_iter and s: max_iter / eta**k for the largest k <= s
        that stays at 1 step or more."""
        band, lowest = float(max_iter), None
        for _ in range(brackets):
            band /= eta
            if band < 1:
                break
            lowest = int(band)
        if lowest is None:
            raise self.error("early_terminate.max_iter", f"{max_iter} / eta is below 1; raise it")
        return lowest

    def parameters(self, spec: Any) -> tuple[dict[str, sweepspec.Token], set[str]]:
        if spec is None:
            return {}, set()
        if not isinstance(spec, dict):
            raise self.error("parameters", "expected a mapping such as lr: {min: 0.001, max: 0.1}")
        params: dict[str, sweepspec.Token] = {}
        continuous: set[str] = set()
        for name, config in spec.items():
            param = Parameter(self.file, self.checked_name(name), config)
            params[param.name] = param.token()
            self.notes += param.notes
            if param.booleans:
                self.booleans.add(param.name)
            if param.distribution in CONTINUOUS:
                continuous.add(param.name)
        return params, continuous

    def checked_name(self, name: Any) -> str:
        if not sweepspec.is_name(str(name)):
            fix = re.sub(r"[^A-Za-z0-9_-]", "_", str(name))
            rule = "letters, digits, '_' and '-', starting with a letter or '_'"
            problem = f"a gpumux parameter's name has {rule}; rename it, e.g. {fix}"
            raise self.error(f"parameters.{name}", problem)
        return str(name)

    def command(self, spec: Any, program: str | None, params: Collection[str]) -> tuple[str, ...]:
        """The command's words, macros expanded but for the args macros (see SweepFile.argv)."""
        if spec is None and program is None:
            return ()
        words = DEFAULT_COMMAND if spec is None else spec
        if not isinstance(words, list | tuple) or not words:
            example = "[${env}, ${interpreter}, ${program}, ${args}]"
            raise self.error("command", f"expected a list of words, e.g. {example}")
        command = tuple(self.word(f"command[{i}]", w, program, params) for i, w in enumerate(words))
        if not any(word in ARGS_MACROS for word in command):
            placed = {name for word in command for name in _BRACES.findall(word)}
            if unplaced := [name for name in params if name not in placed]:
                self.notes.append(
                    f"{self.file}: command has no ${{args}}: gpumux appends --NAME=VALUE for "
                    f"{', '.join(unplaced)} (W&B passes them only to wandb.config); each trial "
                    "also finds its parameters as JSON in GPUMUX_PARAMS"
                )
        return command

    def word(self, key: str, word: Any, program: str | None, params: Collection[str]) -> str:
        if not isinstance(word, str):
            raise self.error(key, f"{word!r} is not text; quote it: '{word}'")
        if word in ARGS_MACROS:
            if word == "${args_no_boolean_flags}" and self.booleans:
                flags = ", ".join(sorted(self.booleans))
                fix = "use ${args} and read --NAME=True or False in the program"
                raise self.error(key, f"gpumux cannot leave out a false flag ({flags}); {fix}")
            return word
        for name in _BRACES.findall(_MACRO.sub("", word)):
            if name in params:
                fix = f"write ${{{name}}} if the parameter is meant"
                problem = f"gpumux would fill {{{name}}} with the parameter, W&B would not; {fix}"
                raise self.error(key, problem)
        return _MACRO.sub(lambda match: self.macro(key, match.group(1), program, params), word)

    def macro(self, key: str, inner: str, program: str | None, params: Collection[str]) -> str:
        """One `${...}` inside a word: its text, or SweepFileError saying what to write."""
        variable = inner.removeprefix("envvar:") if inner.startswith("envvar:") else None
        if inner in MACROS:
            return MACROS[inner]
        if inner == "program" and program is not None:
            return program
        if variable is not None and variable in self.env:
            return self.env[variable]
        if inner in params:
            return f"{{{inner}}}"
        if inner == "program":
            raise self.error(key, "${program} with no program: add program: train.py")
        if variable is not None:
            raise self.error(key, f"${{{inner}}}: {variable} is not set in this environment")
        if f"${{{inner}}}" in ARGS_MACROS:
            raise self.error(key, f"${{{inner}}} is one word per parameter: a list item of its own")
        if inner in ("args_json", "args_json_file"):
            raise self.error(key, READ_PARAMS_JSON)
        known = "env, interpreter, program, args, args_no_hyphens, args_no_boolean_flags, envvar:X"
        raise self.error(key, f"${{{inner}}} is neither a W&B macro ({known}) nor a parameter")
