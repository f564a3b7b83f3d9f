"""The sweep grammar as Optuna's search space: each swept parameter to a distribution."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from gpumux.grammar.sweepspec import Param, Value

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution


@functools.cache
def load_optuna() -> None:
    """Import Optuna, its INFO lines silenced: the first step of every way into Optuna (a
    distribution, a study, a sampler, a pruner), whichever comes first. Optuna is imported only
    where a sweep uses it, never at the top of a module: with numpy it costs 0.3 s of CPU that
    the daemon's start, a grid or random sweep and most commands never need."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def distribution_of(param: Param) -> BaseDistribution | None:
    """The distribution Optuna samples `param` from; None for a constant, which is not searched.

    `lr=1e-3..1e-1` (log) -> FloatDistribution(log=True); `layers=2..6` -> IntDistribution;
    `bs=32,64` -> CategoricalDistribution; a range with :N grid points -> a choice of those N.
    """
    if param.kind == "const":
        return None
    load_optuna()
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    if param.kind == "choice":
        return CategoricalDistribution(param.values)
    if param.points is not None:
        return CategoricalDistribution(param.grid_values())
    low, high = param.low, param.high
    if low is None or high is None:
        raise ValueError(f"{param.name}: a {param.kind} parameter has no range")
    log = param.scale == "log"
    if param.kind == "int":
        return IntDistribution(int(low), int(high), log=log)
    return FloatDistribution(float(low), float(high), log=log)


def distributions_of(params: Sequence[Param]) -> dict[str, BaseDistribution]:
    """The searched parameters' distributions, in the sweep's order."""
    found = {param.name: distribution_of(param) for param in params}
    return {name: dist for name, dist in found.items() if dist is not None}


def constants_of(params: Sequence[Param]) -> dict[str, Value]:
    """The parameters every trial gets unchanged."""
    return {param.name: param.values[0] for param in params if param.kind == "const"}


def searched(params: Mapping[str, Value], distributions: Mapping[str, object]) -> dict[str, Value]:
    """A trial's parameters without its constants: what Optuna chose."""
    return {name: value for name, value in params.items() if name in distributions}
