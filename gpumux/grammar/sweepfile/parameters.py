"""W&B's parameter specifications to the sweep grammar's tokens, one converter per distribution.

value/values -> a constant or a choice; min/max -> an int or float range (`:lin`, or `:log` for
the log-uniform forms, W&B's exponent forms converted to values); a q_* form -> an int range
when q is 1, else a choice of the multiples of q between min and max. Normal, log-normal and
beta distributions have no gpumux form and are refused with a range to use instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpumux.grammar import sweepspec
from gpumux.grammar.sweepfile.loading import SweepFileError

# A q_* distribution becomes a choice of its values; more than this is refused.
MAX_CHOICE_VALUES = 1_000
# Distributions whose values a grid cannot list (W&B refuses them in a grid too).
CONTINUOUS = frozenset(
    {"uniform", "log_uniform", "log_uniform_values", "inv_log_uniform", "inv_log_uniform_values"}
)
UNSUPPORTED = frozenset({"normal", "q_normal", "log_normal", "q_log_normal", "beta", "q_beta"})


@dataclass
class Parameter:
    """One entry of `parameters:`, converted by `token()`; notes and booleans for the reader."""

    file: str
    name: str
    config: Any
    notes: list[str] = field(default_factory=list)
    booleans: bool = False
    distribution: str = ""

    def error(self, problem: str, sub: str = "") -> SweepFileError:
        key = f"parameters.{self.name}" + (f".{sub}" if sub else "")
        return SweepFileError(self.file, key, problem)

    def token(self) -> sweepspec.Token:
        """The grammar's token for this parameter, parsed, or SweepFileError saying what to
        change."""
        if not isinstance(self.config, dict):
            raise self.error("expected a mapping such as {values: [16, 32]} or {min: 1, max: 8}")
        if "parameters" in self.config:
            fix = "name each at the top, e.g. optimizer_lr, and read that flag"
            raise self.error(f"gpumux passes flat parameters, not nested ones; {fix}", "parameters")
        if "probabilities" in self.config:
            problem = "gpumux draws each value equally often; remove probabilities"
            raise self.error(problem, "probabilities")
        self.distribution = dist = self.config.get("distribution") or self._inferred()
        if not isinstance(dist, str):
            raise self.error(f"expected a distribution's name, got {dist!r}", "distribution")
        if dist in UNSUPPORTED:
            raise self.error(_unsupported(self, dist), "distribution")
        if dist not in DISTRIBUTIONS:
            known = ", ".join(DISTRIBUTIONS)
            raise self.error(f"unknown distribution {dist!r}; gpumux reads {known}", "distribution")
        keys, convert = DISTRIBUTIONS[dist]
        for sub in self.config:
            if sub not in keys | {"distribution"}:
                takes = ", ".join(sorted(keys))
                raise self.error(f"{dist} takes {takes}, not {sub}; remove it", str(sub))
        if missing := sorted(keys - {"q"} - self.config.keys()):
            raise self.error(f"{dist} needs {' and '.join(missing)}")
        return convert(self)

    def _inferred(self) -> str:
        """W&B's rule: value -> constant, values -> categorical, min/max ints or floats."""
        config = self.config
        if "value" in config:
            return "constant"
        if "values" in config:
            return "categorical"
        if "min" in config and "max" in config:
            ints = all(type(config[k]) is int for k in ("min", "max"))
            return "int_uniform" if ints else "uniform"
        raise self.error("give value, values, or min and max (or a distribution)")

    def number(self, key: str) -> int | float:
        value = self.config[key]
        if isinstance(value, str):
            # YAML 1.1 reads 1e-5 (no dot) as text; it is a number all the same.
            value = _float_or_none(value)
        if type(value) not in (int, float) or not math.isfinite(value):
            raise self.error(f"expected a number, got {self.config[key]!r}", key)
        return value

    def bounds(self, *, positive: bool = False) -> tuple[int | float, int | float]:
        low, high = self.number("min"), self.number("max")
        if low > high:
            raise self.error(f"min {low} is above max {high}; swap them")
        if positive and low <= 0:
            raise self.error(f"a log scale needs min above 0, got {low}", "min")
        return low, high

    def exp(self, exponent: int | float) -> float:
        """e**exponent, for W&B's forms whose min and max are natural-log exponents."""
        try:
            return math.exp(exponent)
        except OverflowError:
            raise self.error(f"e**{exponent} is too large for a number") from None

    def range(self, low: int | float, high: int | float, scale: str) -> sweepspec.Token:
        if type(low) is int and type(high) is int:
            return self.parsed(f"{self.name}={low}..{high}:{scale}")
        text = f"{sweepspec.format_value(float(low))}..{sweepspec.format_value(float(high))}"
        return self.parsed(f"{self.name}={text}:{scale}")

    def choice(self, values: Any) -> sweepspec.Token:
        if not isinstance(values, list) or not values:
            raise self.error("expected a non-empty list, e.g. values: [16, 32]", "values")
        texts = [self._text(value) for value in values]
        token = self.parsed(f"{self.name}={','.join(texts)}")
        read_back = token.param.values
        if len(read_back) != len(texts) or not all(map(_same, read_back, texts)):
            rule = "a value cannot hold ',' or '..', nor start or end with a space"
            problem = f"{token.text!r} reads back as other values ({rule}); rename the value"
            raise self.error(problem)
        return token

    def parsed(self, text: str) -> sweepspec.Token:
        """The token `text` parsed: the one parse of a file's parameter."""
        try:
            return sweepspec.Token(text, sweepspec.parse_param(text))
        except sweepspec.SpecError as error:
            raise self.error(f"gpumux cannot write this as a parameter: {error}") from error

    def _text(self, value: Any) -> str:
        """A value as the command line gets it (W&B's str(): True, 0.001, adam)."""
        if isinstance(value, bool):
            self.booleans = True
            return str(value)
        if type(value) is float and not math.isfinite(value):
            raise self.error(f"{value} is not a finite number")
        if type(value) in (int, float):
            return sweepspec.format_value(value)
        if isinstance(value, str):
            return value
        raise self.error(f"a value is a number, text or true/false, not {value!r}")

    def quantized(self, low: int | float, high: int | float, scale: str) -> sweepspec.Token:
        """round(X / q) * q: the whole numbers in the scale for q 1, else a choice of the
        multiples of q between min and max."""
        q = self.number("q") if "q" in self.config else 1
        if q <= 0:
            raise self.error(f"q must be above 0, got {q}", "q")
        if q == 1 and type(q) is int:
            first, last = math.ceil(low), math.floor(high)
            if first > last:
                raise self.error(f"no whole number lies between min {low} and max {high}")
            return self.range(first, last, scale)
        first, last = math.ceil(low / q - 1e-9), math.floor(high / q + 1e-9)
        count = last - first + 1
        if count < 1:
            raise self.error(f"no multiple of q={q} lies between min {low} and max {high}")
        if count > MAX_CHOICE_VALUES:
            plain = self.distribution.removeprefix("q_")
            problem = f"{count:,} multiples of q={q}, over the {MAX_CHOICE_VALUES:,} of a choice"
            raise self.error(f"{problem}; raise q, or use {plain} (a range)")
        values = [k * q if type(q) is int else _rounded(k * q) for k in range(first, last + 1)]
        if scale == "log":
            self.notes.append(
                f"{self.file}: parameters.{self.name}: {self.distribution} becomes a choice of "
                f"{count} values, each as likely (W&B favours the small ones)"
            )
        return self.choice(values)


def _same(parsed: sweepspec.Value, text: str) -> bool:
    """Whether the grammar read `text` back as itself (numbers may be spelt differently)."""
    return parsed == text if isinstance(parsed, str) else float(text) == parsed


def _float_or_none(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _rounded(value: float) -> float:
    return float(f"{value:.{sweepspec.SIGNIFICANT_DIGITS}g}")


def _unsupported(param: Parameter, dist: str) -> str:
    """Why `dist` is refused, and the range that covers most of it."""
    if "normal" not in dist:
        fix = "distribution: uniform, min: 0, max: 1"
    else:
        mu = param.number("mu") if "mu" in param.config else 0
        sigma = param.number("sigma") if "sigma" in param.config else 1
        low, high = mu - 2 * sigma, mu + 2 * sigma
        if "log" in dist:
            low, high = math.exp(low), math.exp(high)
        form = "log_uniform_values" if "log" in dist else "uniform"
        fix = f"distribution: {form}, min: {low:.4g}, max: {high:.4g}"
        fix += " (mu ± 2 sigma)"
    return f"{dist} has no gpumux form (ranges and choices only); use {fix}"


def _constant(param: Parameter) -> sweepspec.Token:
    return param.choice([param.config["value"]])


def _categorical(param: Parameter) -> sweepspec.Token:
    return param.choice(param.config["values"])


def _int_uniform(param: Parameter) -> sweepspec.Token:
    low, high = param.bounds()
    if type(low) is not int or type(high) is not int:
        raise param.error("int_uniform takes whole numbers; use uniform for a float range")
    return param.range(low, high, "lin")


def _uniform(param: Parameter) -> sweepspec.Token:
    low, high = param.bounds()
    return param.range(float(low), float(high), "lin")


def _log_uniform_values(param: Parameter) -> sweepspec.Token:
    """log X uniform between log min and log max; inv_log_uniform_values is the same law."""
    low, high = param.bounds(positive=True)
    return param.range(float(low), float(high), "log")


def _log_uniform(param: Parameter) -> sweepspec.Token:
    low, high = param.bounds()
    return param.range(param.exp(low), param.exp(high), "log")


def _inv_log_uniform(param: Parameter) -> sweepspec.Token:
    """log(1/X) uniform between min and max: X log-uniform between e**-max and e**-min."""
    low, high = param.bounds()
    return param.range(param.exp(-high), param.exp(-low), "log")


def _q_uniform(param: Parameter) -> sweepspec.Token:
    return param.quantized(*param.bounds(), "lin")


def _q_log_uniform_values(param: Parameter) -> sweepspec.Token:
    return param.quantized(*param.bounds(positive=True), "log")


def _q_log_uniform(param: Parameter) -> sweepspec.Token:
    low, high = param.bounds()
    return param.quantized(param.exp(low), param.exp(high), "log")


_RANGE = frozenset({"min", "max"})
_QUANTIZED = _RANGE | {"q"}
DISTRIBUTIONS: dict[str, tuple[frozenset[str], Callable[[Parameter], sweepspec.Token]]] = {
    "constant": (frozenset({"value"}), _constant),
    "categorical": (frozenset({"values"}), _categorical),
    "int_uniform": (_RANGE, _int_uniform),
    "uniform": (_RANGE, _uniform),
    "log_uniform_values": (_RANGE, _log_uniform_values),
    "log_uniform": (_RANGE, _log_uniform),
    "inv_log_uniform_values": (_RANGE, _log_uniform_values),
    "inv_log_uniform": (_RANGE, _inv_log_uniform),
    "q_uniform": (_QUANTIZED, _q_uniform),
    "q_log_uniform_values": (_QUANTIZED, _q_log_uniform_values),
    "q_log_uniform": (_QUANTIZED, _q_log_uniform),
}
