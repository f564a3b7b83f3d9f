"""The samplers and pruners a sweep may name, checked before anything is stored.

`--search tpe|gp|cmaes|qmc[:k=v,...]` picks an Optuna sampler and `--prune
median|asha|hyperband[:k=v,...]` an Optuna pruner, the options passed to its constructor over
gpumux's own choices. Each refusal says what is wrong and what to write instead.
"""

from __future__ import annotations

import functools
import inspect
import math
import types
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpumux.fields import MAX_COUNT
from gpumux.grammar.searchspec import (
    OPTION_CHARS,
    Options,
    OptionValue,
    spec_text,
    split_spec,
)

# Re-exported: the API and the CLI catch it as methods.SearchError.
from gpumux.grammar.searchspec import SearchError as SearchError
from gpumux.grammar.sweepspec import Param
from gpumux.search.space import distributions_of, load_optuna
from gpumux.status import SearchMethod
from gpumux.text import first_line, quoted

if TYPE_CHECKING:
    from optuna.pruners import BasePruner
    from optuna.samplers import BaseSampler

# The pruners' names, known without Optuna: a sweep that names none never imports it.
PRUNER_NAMES = ("median", "asha", "hyperband")
NO_PRUNING = "none"
PRUNE_FORMS = "none, median, asha or hyperband, options after a colon: asha:reduction_factor=3"
# Options a sweep sets otherwise: the seed is --seed (a restart reseeds from it).
_NOT_OPTIONS = frozenset({"self", "seed"})
_BUILTINS: dict[str, type] = {
    "bool": bool,
    "int": int,
    "float": float,
    "str": str,
    "None": type(None),
}
# A sampler's numpy random state takes a 32-bit seed.
SEED_MODULUS = 2**32


@functools.cache
def pruners() -> dict[str, type[BasePruner]]:
    """The pruner of each of PRUNER_NAMES."""
    load_optuna()
    from optuna.pruners import HyperbandPruner, MedianPruner, SuccessiveHalvingPruner

    return {"median": MedianPruner, "asha": SuccessiveHalvingPruner, "hyperband": HyperbandPruner}


@functools.cache
def samplers() -> dict[SearchMethod, Callable[..., BaseSampler]]:
    """The sampler of each adaptive method; each takes a seed and keyword options: called as
    such, not as BaseSampler."""
    load_optuna()
    from optuna.samplers import CmaEsSampler, GPSampler, QMCSampler, TPESampler

    return {
        SearchMethod.tpe: TPESampler,
        SearchMethod.gp: GPSampler,
        SearchMethod.cmaes: CmaEsSampler,
        SearchMethod.qmc: QMCSampler,
    }


@dataclass(frozen=True)
class PruneSpec:
    """A pruner by name with the options for its constructor."""

    name: str
    options: Options = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The form it was given in, normalised: asha:min_resource=2,reduction_factor=3."""
        return spec_text(self.name, dict(self.options))


def parse_prune(text: str) -> PruneSpec | None:
    """`asha:min_resource=2` -> PruneSpec; None for `none`. Options are checked by make_pruner."""
    name = text.strip().partition(":")[0].strip().lower()
    if name == NO_PRUNING and ":" not in text:
        return None
    if name not in PRUNER_NAMES:
        raise SearchError(f"unknown pruner {name!r}; use {PRUNE_FORMS}")
    example = f"{_option_names(pruners()[name])[0]}=2"
    _, options = split_spec(text, flag="pruner", example=example)
    return PruneSpec(name, options)


def make_pruner(spec: PruneSpec | None) -> BasePruner:
    """The Optuna pruner the spec names, or one that never prunes; SearchError for options it
    would refuse, now or at its first step."""
    if spec is None:
        load_optuna()
        from optuna.pruners import NopPruner

        return NopPruner()
    cls = pruners()[spec.name]
    options = _checked_options(spec, cls)
    try:
        pruner = cls(**spec.options)
    except (TypeError, ValueError) as error:
        raise SearchError(f"{spec.text}: {error}") from error
    # Optuna checks the rest only when it first prunes, in the scheduler's tick.
    _check_rungs(spec.name, options)
    return pruner


def startup_trials(budget: int) -> int:
    """How many of a model-based sweep's trials are drawn at random before its model chooses.

    Optuna's 10 suits budgets of a hundred; a sweep of 12 would be random search to its end.
    A quarter of the budget, at least 2 (a good and a bad trial to tell apart), at most 10."""
    return max(2, min(10, budget // 4))


def gpumux_defaults(method: SearchMethod, *, budget: int) -> Options:
    """What gpumux sets on a method's sampler, which the sweep's own options override."""
    if method is SearchMethod.tpe:
        # Running trials count as if they had the worst value: parallel asks spread out.
        return {
            "constant_liar": True,
            "multivariate": True,
            "n_startup_trials": startup_trials(budget),
        }
    if method is SearchMethod.gp:
        return {"n_startup_trials": startup_trials(budget)}
    if method is SearchMethod.cmaes:
        return {"warn_independent_sampling": False}
    if method is SearchMethod.qmc:
        return {"scramble": True, "warn_independent_sampling": False}
    return {}


def make_sampler(
    method: SearchMethod, *, seed: int, budget: int, options: Mapping[str, OptionValue] = {}
) -> BaseSampler:
    """A fresh Optuna sampler for an adaptive sweep of `budget` trials, seeded (replays what
    the sampler allows), with the sweep's checked options over gpumux's."""
    if not method.adaptive:
        raise SearchError(f"{method} is not chosen by a sampler as the sweep runs")
    sampler = samplers()[method]
    from optuna.exceptions import ExperimentalWarning

    with warnings.catch_warnings():
        # QMC and GP are marked experimental by Optuna; their use here is deliberate.
        warnings.simplefilter("ignore", ExperimentalWarning)
        return sampler(
            seed=seed % SEED_MODULUS, **{**gpumux_defaults(method, budget=budget), **options}
        )


def sampler_options(method: SearchMethod) -> dict[str, type]:
    """The options `--search METHOD:k=v` may set, each with its type: the sampler's
    constructor arguments that take a bool, a number or a text (not its seed, --seed's)."""
    if not method.adaptive:
        return {}
    cls = samplers()[method]
    accepted: dict[str, type] = {}
    for name, parameter in inspect.signature(cls.__init__).parameters.items():
        kinds = {
            kind
            for kind in _types_of(parameter.annotation)
            if isinstance(kind, type) and kind is not type(None)
        }
        if name not in _NOT_OPTIONS and len(kinds) == 1 and kinds <= {bool, int, float, str}:
            accepted[name] = kinds.pop()
    return accepted


def check_sampler_options(
    method: SearchMethod, options: Mapping[str, OptionValue], *, budget: int
) -> Options:
    """The sweep's sampler options, each of the type its constructor takes ("true" read as a
    bool); SearchError naming the accepted options for one it has not or would refuse."""
    if not options:
        return {}
    if not method.adaptive:
        raise SearchError(
            f"--search {method} takes no options (its draws are seeded by --seed); options "
            "are for tpe, gp, cmaes and qmc: --search tpe:n_startup_trials=4"
        )
    accepted = sampler_options(method)
    listed = ", ".join(accepted)
    checked: Options = {}
    for key, value in options.items():
        if key == "seed":
            raise SearchError(f"--search {method}: the seed is --seed, not an option")
        kind = accepted.get(key)
        if kind is None:
            shown = quoted(key, OPTION_CHARS)
            raise SearchError(f"--search {method} has no option {shown}; its options: {listed}")
        checked[key] = _typed(method, key, kind, value)
    given = f"--search {spec_text(str(method), checked)}"
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always", FutureWarning)
        try:
            make_sampler(method, seed=0, budget=budget, options=checked)
        except (TypeError, ValueError) as error:
            raise SearchError(f"{given}: {first_line(str(error), OPTION_CHARS)}") from error
    for warning in warned:
        # An option Optuna deprecates would be refused by the release that drops it.
        said = str(warning.message)
        if issubclass(warning.category, FutureWarning) and any(key in said for key in checked):
            raise SearchError(
                f"{given}: Optuna says: {first_line(said, OPTION_CHARS)} Leave it out."
            )
    return checked


def _types_of(annotation: object) -> tuple[object, ...]:
    """The types an annotation allows: (int, NoneType) for `int | None`, written as text too
    (Optuna's modules postpone their annotations); only the builtins are named from text."""
    if isinstance(annotation, str):
        return tuple(_BUILTINS.get(part.strip(), part) for part in annotation.split("|"))
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return typing.get_args(annotation)
    return (annotation,)


def _typed(method: SearchMethod, key: str, kind: type, value: OptionValue) -> OptionValue:
    """`value` as the `kind` the option takes, or SearchError saying what it takes."""
    where = f"--search {method}:{key}"
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise SearchError(f"{where} takes true or false; e.g. {method}:{key}=true")
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
            return value
        raise SearchError(
            f"{where} takes a whole number from 0 to {MAX_COUNT:,}; e.g. {method}:{key}=4"
        )
    if kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        raise SearchError(f"{where} takes a finite number; e.g. {method}:{key}=0.5")
    if isinstance(value, str):
        return value
    raise SearchError(f"{where} takes a word; e.g. {method}:{key}=sobol")


@dataclass(frozen=True)
class Search:
    """How a sweep's trials are chosen and stopped, once checked."""

    method: SearchMethod
    prune: PruneSpec | None
    # The sampler's options the sweep sets, checked (see check_sampler_options).
    options: Options = field(default_factory=dict)


def check(
    *,
    method: SearchMethod | None,
    options: Mapping[str, OptionValue] = {},
    prune: str | None,
    trials: int | None,
    metric: str | None,
    params: Sequence[Param],
) -> Search:
    """The sweep's search, or SearchError saying what to change (nothing is stored before).
    What the daemon's host must have installed is check_installed's."""
    if method is None:
        method = SearchMethod.random if trials is not None else SearchMethod.grid
    if method is SearchMethod.grid and trials is not None:
        raise SearchError(
            "--search grid runs every point of the grid; drop --trials, or use --search random "
            "or an adaptive search (tpe) for a budget of trials"
        )
    if method is not SearchMethod.grid and trials is None:
        raise SearchError(f"--search {method} needs a budget of trials: add --trials K")
    if method.adaptive:
        _check_adaptive(method, metric, params)
    checked = check_sampler_options(method, options, budget=trials or 0)
    spec = parse_prune(prune) if prune is not None else None
    if spec is not None:
        if metric is None:
            raise SearchError(
                f"--prune {spec.name} compares trials on the objective: add --objective "
                "METRIC:min or METRIC:max (the metric the trials report at each step)"
            )
        make_pruner(spec)
    return Search(method, spec, checked)


def _check_adaptive(method: SearchMethod, metric: str | None, params: Sequence[Param]) -> None:
    if metric is None:
        raise SearchError(
            f"--search {method} learns from each trial's objective: add --objective "
            "METRIC:min or METRIC:max"
        )
    distributions = distributions_of(params)
    if not distributions:
        raise SearchError(
            f"--search {method} has nothing to search: give a range (lr=1e-4..1e-1) or a "
            "choice (bs=32,64)"
        )
    if method is SearchMethod.cmaes:
        choices = [p for p in params if p.name in distributions and p.kind == "choice"]
        choices += [p for p in params if p.name in distributions and p.points is not None]
        if choices:
            raise SearchError(
                f"--search cmaes takes only numeric ranges, and {choices[0].name} is a choice "
                "of values; use --search tpe (or gp), or make it a range without :N"
            )


def check_installed(method: SearchMethod) -> None:
    """SearchError where this host lacks what the method's sampler runs on: the daemon's
    check, since the command line that submits may run elsewhere."""
    if method is SearchMethod.gp:
        try:
            import torch  # noqa: F401
        except ImportError as error:
            raise SearchError(
                "--search gp needs PyTorch where the daemon runs (pip install torch); or use "
                "--search tpe"
            ) from error


def _option_defaults(cls: type[BasePruner]) -> dict[str, object]:
    parameters = inspect.signature(cls.__init__).parameters
    return {name: p.default for name, p in parameters.items() if name != "self"}


def _option_names(cls: type[BasePruner]) -> list[str]:
    return list(_option_defaults(cls))


def _checked_options(spec: PruneSpec, cls: type[BasePruner]) -> dict[str, int | str]:
    """Every option of the pruner, given or default: each counts steps or trials, so each is a
    whole number a step can be, or 'auto' where that is its default."""
    defaults = _option_defaults(cls)
    unknown = [key for key in spec.options if key not in defaults]
    if unknown:
        raise SearchError(
            f"{spec.name} has no option {unknown[0]!r}; its options: {', '.join(defaults)}"
        )
    options: dict[str, int | str] = {}
    for key, default in defaults.items():
        value = spec.options.get(key, default)
        auto = default == "auto"
        if not (value == "auto" and auto) and (
            not isinstance(value, int) or not 0 <= value <= MAX_COUNT
        ):
            raise SearchError(
                f"{spec.name}:{key} takes a whole number from 0 to {MAX_COUNT:,}"
                + (" or auto" if auto else "")
                + f"; e.g. {spec.name}:{key}=2"
            )
        assert isinstance(value, int | str)
        options[key] = value
    return options


def _check_rungs(name: str, options: dict[str, int | str]) -> None:
    """Refuse resources that make the pruner fail at its first step, or never prune."""
    if "min_resource" not in options:
        # The median pruner's options are counts that Optuna checks when it is made.
        return
    low = options["min_resource"]
    low = 1 if low == "auto" else int(low)
    factor = int(options["reduction_factor"])
    if name == "hyperband":
        high = options["max_resource"]
        if low < 1 or factor < 2:
            raise SearchError(
                "hyperband needs min_resource of at least 1 and reduction_factor of at least 2; "
                "e.g. hyperband:min_resource=1,reduction_factor=3"
            )
        if high != "auto" and int(high) < low:
            raise SearchError(
                f"hyperband:max_resource (the last step) must be at least min_resource ({low}); "
                "raise it, or leave it out (auto: the longest finished trial's steps)"
            )
    if name == "asha":
        rate = int(options["min_early_stopping_rate"])
        # Its first rung is at step low * factor ** rate: computed as a logarithm, since the
        # power itself may have billions of digits.
        if math.log(low) + rate * math.log(factor) > math.log(MAX_COUNT):
            raise SearchError(
                "asha would never prune: its first rung (min_resource × reduction_factor ** "
                f"min_early_stopping_rate steps) lies beyond the last step a trial can report "
                f"({MAX_COUNT:,}); lower min_early_stopping_rate"
            )
