"""The samplers and pruners a sweep may name, checked before anything is stored.

`--search tpe|gp|cmaes|qmc` picks an Optuna sampler; `--prune median|asha|hyperband[:k=v,...]`
an Optuna pruner, its options passed through to its constructor. Each refusal says what is
wrong and what to write instead.
"""

from __future__ import annotations

import inspect
import math
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.pruners import (
    BasePruner,
    HyperbandPruner,
    MedianPruner,
    NopPruner,
    SuccessiveHalvingPruner,
)
from optuna.samplers import BaseSampler

from gpumux.fields import MAX_COUNT
from gpumux.search.space import distributions_of
from gpumux.status import SearchMethod
from gpumux.sweepspec import Param

PRUNERS: dict[str, type[BasePruner]] = {
    "median": MedianPruner,
    "asha": SuccessiveHalvingPruner,
    "hyperband": HyperbandPruner,
}
NO_PRUNING = "none"
PRUNE_FORMS = "none, median, asha or hyperband, options after a colon: asha:reduction_factor=3"
_OPTION = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=([^,=]+)")
# A sampler's numpy random state takes a 32-bit seed.
SEED_MODULUS = 2**32

optuna.logging.set_verbosity(optuna.logging.WARNING)


class SearchError(ValueError):
    """A search or pruner the sweep cannot have; the message says why and what to do."""


@dataclass(frozen=True)
class PruneSpec:
    """A pruner by name with the options for its constructor."""

    name: str
    options: dict[str, int | float | str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The form it was given in, normalised: asha:min_resource=2,reduction_factor=3."""
        if not self.options:
            return self.name
        return f"{self.name}:" + ",".join(f"{k}={v}" for k, v in self.options.items())


def parse_prune(text: str) -> PruneSpec | None:
    """`asha:min_resource=2` -> PruneSpec; None for `none`. Options are checked by make_pruner."""
    name, colon, rest = text.strip().partition(":")
    name = name.strip().lower()
    if name == NO_PRUNING and not colon:
        return None
    if name not in PRUNERS:
        raise SearchError(f"unknown pruner {name!r}; use {PRUNE_FORMS}")
    options: dict[str, int | float | str] = {}
    if colon:
        for item in rest.split(","):
            match = _OPTION.fullmatch(item.strip())
            if match is None:
                raise SearchError(
                    f"pruner option {item.strip()!r} is not NAME=VALUE; e.g. "
                    f"{name}:{_option_names(PRUNERS[name])[0]}=2"
                )
            key, value = match.groups()
            if key in options:
                raise SearchError(f"pruner option {key} given twice; keep one")
            options[key] = _number_or_text(value.strip())
    return PruneSpec(name, options)


def make_pruner(spec: PruneSpec | None) -> BasePruner:
    """The Optuna pruner the spec names, or one that never prunes; SearchError for options it
    would refuse, now or at its first step."""
    if spec is None:
        return NopPruner()
    cls = PRUNERS[spec.name]
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


def make_sampler(method: SearchMethod, *, seed: int, budget: int) -> BaseSampler:
    """A fresh Optuna sampler for an adaptive sweep of `budget` trials, seeded (replays what
    the sampler allows)."""
    seed %= SEED_MODULUS
    startup = startup_trials(budget)
    with warnings.catch_warnings():
        # QMC and GP are marked experimental by Optuna; their use here is deliberate.
        warnings.simplefilter("ignore", ExperimentalWarning)
        if method is SearchMethod.tpe:
            # Running trials count as if they had the worst value: parallel asks spread out.
            return optuna.samplers.TPESampler(
                seed=seed, constant_liar=True, multivariate=True, n_startup_trials=startup
            )
        if method is SearchMethod.gp:
            return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup)
        if method is SearchMethod.cmaes:
            return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
        if method is SearchMethod.qmc:
            return optuna.samplers.QMCSampler(
                scramble=True, seed=seed, warn_independent_sampling=False
            )
    raise SearchError(f"{method} is not chosen by a sampler as the sweep runs")


@dataclass(frozen=True)
class Search:
    """How a sweep's trials are chosen and stopped, once checked."""

    method: SearchMethod
    prune: PruneSpec | None


def check(
    *,
    method: SearchMethod | None,
    prune: str | None,
    trials: int | None,
    objective: str | None,
    params: Sequence[Param],
) -> Search:
    """The sweep's search, or SearchError saying what to change (nothing is stored before)."""
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
        _check_adaptive(method, objective, params)
    spec = parse_prune(prune) if prune is not None else None
    if spec is not None:
        if objective is None:
            raise SearchError(
                f"--prune {spec.name} compares trials on the objective: add --objective "
                "METRIC:min or METRIC:max (the metric the trials report at each step)"
            )
        make_pruner(spec)
    return Search(method, spec)


def _check_adaptive(method: SearchMethod, objective: str | None, params: Sequence[Param]) -> None:
    if objective is None:
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


def _number_or_text(text: str) -> int | float | str:
    """An option's value: an int for a whole number (1e3 too), a float, else the text."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return text
    # Neither NaN nor infinity is whole: both stay floats, and are refused as such.
    return int(number) if number.is_integer() else number
