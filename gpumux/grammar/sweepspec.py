"""The sweep grammar: PARAM tokens -> parameter space -> the parameter dict of every trial."""

from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from gpumux.text import QUOTE_CHARS, cut

Value = int | float | str

DEFAULT_POINTS = 5
# Structural limits, part of the API's schema: what one sweep may hold, checked before any work.
MAX_POINTS = 100_000
MAX_PARAMS = 256
MAX_CHOICES = 1_000
MAX_TOKEN_CHARS = 16_384
MAX_PARAMS_CHARS = 65_536
SIGNIFICANT_DIGITS = 10
# Log and :N spacing go through floats, which hold every integer exactly only up to 2**53.
MAX_INT_END = 2**53

FORMS = "name=value, name=lo..hi[:log|:lin][:N] or name=a,b,c"
_NAME_RULE = "use letters, digits, '_' and '-', starting with a letter or '_'"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_DOTS = re.compile(r"\.{3,}")


class SpecError(ValueError):
    """A sweep specification the grammar refuses; the message names the token and the fix."""

    def __init__(self, message: str, *, token: str = "") -> None:
        super().__init__(message)
        self.token = token


class GridTooLarge(SpecError):
    """A full grid with more trials than the limit allows."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"the grid has {describe_count(size)} trials, over the limit of {limit:,}; "
            "use --trials K for a random search or fewer grid points (:N)"
        )
        self.size = size
        self.limit = limit


@dataclass(frozen=True)
class Param:
    """One swept parameter: a float or int range, a choice, or a constant."""

    name: str
    kind: Literal["float", "int", "choice", "const"]
    low: int | float | None = None
    high: int | float | None = None
    scale: Literal["log", "lin"] | None = None
    points: int | None = None
    values: tuple[Value, ...] = ()

    def grid_values(self) -> tuple[Value, ...]:
        """The values this parameter takes in a full grid (ranges ascending, without repeats)."""
        if self.kind in ("choice", "const"):
            return self.values
        lo, hi = self._ends()
        if lo == hi:
            return (self._clamp(lo),)
        if self.kind == "int" and self.points is None:
            return tuple(range(int(lo), int(hi) + 1))
        n = max(self.points or DEFAULT_POINTS, 2)
        inner = [self._at(i / (n - 1)) for i in range(1, n - 1)]
        # The ends are kept exactly as typed; only the points between them are rounded.
        return tuple(sorted({self._clamp(lo), *(self._clamp(v) for v in inner), self._clamp(hi)}))

    def sample(self, rng: random.Random) -> Value:
        """One draw, uniform in the scale for ranges (rounded like grid points) or over a choice."""
        if self.kind == "const":
            return self.values[0]
        if self.kind == "choice":
            return rng.choice(self.values)
        lo, hi = self._ends()
        if self.kind == "int" and self.scale != "log":
            return rng.randint(int(lo), int(hi))
        return self._clamp(self._at(rng.random()))

    def _ends(self) -> tuple[float, float]:
        if self.low is None or self.high is None:
            raise ValueError(f"{self.name}: a {self.kind} parameter has no range")
        return self.low, self.high

    def _at(self, t: float) -> float:
        """The point a fraction t of the way from low to high in this parameter's scale."""
        lo, hi = self._ends()
        if self.scale == "log":
            log_lo, log_hi = math.log(lo), math.log(hi)
            return math.exp(min(max(log_lo * (1 - t) + log_hi * t, log_lo), log_hi))
        # Weighted sum rather than lo + (hi - lo) * t: hi - lo overflows for ends near ±1e308.
        return lo * (1 - t) + hi * t

    def _clamp(self, value: float) -> int | float:
        """Round to this parameter's type (10 significant digits for floats), inside [low, high]."""
        lo, hi = self._ends()
        if self.kind == "int":
            return min(max(round(value), int(lo)), int(hi))
        rounded = float(f"{value:.{SIGNIFICANT_DIGITS}g}") if lo < value < hi else value
        return min(max(rounded, lo), hi)


class Token(NamedTuple):
    """One PARAM token as written (what the API is sent), and the Param it parses into."""

    text: str
    param: Param


def is_name(text: str) -> bool:
    """Whether `text` may name a parameter."""
    return _NAME.fullmatch(text) is not None


def parse_param(token: str) -> Param:
    """Parse one `name=value` token, or raise SpecError saying how to fix it."""
    name, sep, value = token.partition("=")
    if not sep:
        before, colon, after = token.partition(":")
        if colon and after and _NAME.fullmatch(before):
            raise _error(token, f"write '=' between name and value: {_cut(f'{before}={after}')}")
        where = "options go before the parameters" if token.startswith("-") else "no '='"
        command = "if this starts the command, put '--' before it"
        raise _error(token, f"{where}; expected {FORMS}; {command}")
    if not name:
        raise _error(token, f"no parameter name; expected name=value, e.g. {_cut('lr' + token)}")
    if not _NAME.fullmatch(name):
        bare = name.lstrip("-")
        if bare != name and _NAME.fullmatch(bare):
            fix = _cut(f"{bare}={value}")
            raise _error(token, f"drop the leading dashes (gpumux adds them): {fix}")
        raise _error(token, f"{_cut(name)!r} is not a parameter name; {_NAME_RULE}")
    value = value.strip()
    if not value:
        raise _error(token, f"no value; expected {FORMS}")
    # A path such as ../data is a constant, not a range with a missing low end.
    if ".." in value.split(":")[0] and value != ".." and not set("/\\") & set(value):
        return _parse_range(token, name, value)
    if value[-4:].lower() in (":log", ":lin"):
        suffix = value[-4:]
        fix = _cut(f"{name}=1e-3..1e-1{suffix}")
        raise _error(token, f"{suffix!r} applies only to a range, e.g. {fix}")
    if "," in value:
        return _parse_choice(token, name, value)
    return Param(name, "const", values=(_typed(value),))


def parse_params(tokens: Sequence[str]) -> list[Param]:
    """Parse every PARAM token; a parameter given twice is an error."""
    return [token.param for token in parse_tokens(tokens).values()]


def parse_tokens(tokens: Sequence[str]) -> dict[str, Token]:
    """Every PARAM token with what it parses into, by name in their order; a parameter given
    twice is an error."""
    check_sizes(tokens)
    params: dict[str, Token] = {}
    for token, following in itertools.zip_longest(tokens, tokens[1:], fillvalue="="):
        # The shell splits `bs=32, 64` or `lr= 0.1` into two arguments; say so, not "empty item".
        split = token.endswith(("=", ",", "..")) or following.startswith((",", ".."))
        if split and "=" in token and "=" not in following:
            fix = f"a space splits this value in two; write {_cut(token + following)}"
            raise SpecError(f"{_cut(token)} {_cut(following)}: {fix}", token=token)
        param = parse_param(token)
        if param.name in params:
            earlier_token, earlier = params[param.name]
            hint = "keep one"
            if earlier.kind in ("choice", "const") and param.kind in ("choice", "const"):
                merged = dict.fromkeys(format_value(v) for v in earlier.values + param.values)
                hint = f"for several values write one choice: {_cut_choice(param.name, merged)}"
            also = f"{_cut(param.name)} given twice (also {_cut(earlier_token)})"
            raise _error(token, f"{also}; {hint}")
        params[param.name] = Token(token, param)
    return params


def check_sizes(tokens: Sequence[str]) -> None:
    """Refuse more tokens, or longer ones, than a sweep may hold, before any is parsed."""
    if len(tokens) > MAX_PARAMS:
        raise SpecError(
            f"{len(tokens):,} parameters, over the limit of {MAX_PARAMS}; "
            "sweep fewer, or pass the constant ones in the command"
        )
    for token in tokens:
        if len(token) > MAX_TOKEN_CHARS:
            name = _cut(token.partition("=")[0])
            raise SpecError(
                f"parameter {name!r}: {len(token):,} characters, over the limit of "
                f"{MAX_TOKEN_CHARS:,} for one parameter; use a range (lo..hi:N) or fewer values"
            )
    total = sum(len(token) for token in tokens)
    if total > MAX_PARAMS_CHARS:
        raise SpecError(
            f"the parameters take {total:,} characters, over the limit of {MAX_PARAMS_CHARS:,}; "
            "use ranges (lo..hi:N) or fewer values"
        )


def grid_size(params: Sequence[Param]) -> int:
    """The number of trials in the full grid, computed without expanding it.

    Exact but for two kinds of range with :N, counted as N points (an integer range: at most
    hi - lo + 1) even where rounding merges some: a logarithmic integer range, and a float
    range whose points are closer than SIGNIFICANT_DIGITS tell apart. Counting those would
    mean computing every point, which is the cost this avoids.
    """
    return math.prod(_grid_count(param) for param in params)


def describe_count(count: int) -> str:
    """A count as text, `1,234`, or `about 10^1280` for one too long to print."""
    if count < 10**15:
        return f"{count:,}"
    # From the bit length: str() of a huge int costs, and fails past 4,300 digits.
    return f"about 10^{int((count.bit_length() - 1) * math.log10(2))}"


def expand(
    params: Sequence[Param], *, trials: int | None, seed: int, max_grid: int
) -> list[dict[str, Value]]:
    """The parameter dict of every trial: the full grid, or `trials` seeded random draws."""
    if trials is None:
        size = grid_size(params)
        if size > max_grid:
            raise GridTooLarge(size, max_grid)
        names = [param.name for param in params]
        combos = itertools.product(*(param.grid_values() for param in params))
        return [dict(zip(names, combo, strict=True)) for combo in combos]
    if trials < 1:
        raise _error(
            f"--trials {trials}", "a random search needs at least 1 trial; use --trials 1 or more"
        )
    rng = random.Random(seed)
    return [{param.name: param.sample(rng) for param in params} for _ in range(trials)]


def format_value(value: Value) -> str:
    """The command-line text of a value; floats use repr so that they parse back unchanged."""
    return repr(value) if isinstance(value, float) else str(value)


def format_param(param: Param) -> str:
    """The token that parses back into this Param (for display and storage)."""
    if param.kind in ("choice", "const"):
        return f"{param.name}={','.join(format_value(v) for v in param.values)}"
    lo, hi = param._ends()
    text = f"{param.name}={format_value(lo)}..{format_value(hi)}:{param.scale}"
    return text if param.points is None else f"{text}:{param.points}"


def _error(token: str, problem: str) -> SpecError:
    return SpecError(f"{_cut(token)}: {problem}", token=token)


def _cut(text: str) -> str:
    """`text` as an error quotes it: cut by gpumux.text's rule."""
    return cut(text, QUOTE_CHARS)


def _cut_choice(name: str, items: Iterable[str]) -> str:
    return _cut(f"{name}={','.join(items)}")


def _int(text: str) -> int | None:
    if not _INT.fullmatch(text):
        return None
    try:
        return int(text)
    except ValueError:  # more digits than Python converts by default
        return None


def _float(text: str) -> float | None:
    if not _FLOAT.fullmatch(text):
        return None
    number = float(text)
    return number if math.isfinite(number) else None


def _typed(text: str) -> Value:
    as_int = _int(text)
    if as_int is not None:
        return as_int
    as_float = _float(text)
    return text if as_float is None else as_float


def _parse_range(token: str, name: str, value: str) -> Param:
    head, *suffixes = value.split(":")
    shown = _cut(name)
    example = f"e.g. {shown}=1e-3..1e-1"
    if dots := _DOTS.search(head):
        fixed = _cut(token.replace(dots.group(), "..", 1))
        raise _error(
            token, f"{_cut(dots.group())!r} is not a range; write a range with two dots: {fixed}"
        )
    if "," in head:
        raise _error(token, f"write a range or a choice, not both: {shown}=lo..hi or {shown}=a,b,c")
    if head.count("..") > 1:
        raise _error(token, f"a range has two ends; for N grid points add :N, e.g. {shown}=1..10:5")
    lo_text, hi_text = (end.strip() for end in head.split(".."))
    if not lo_text or not hi_text:
        raise _error(token, f"a range needs both ends; expected name=lo..hi, {example}")
    lo, hi = _float(lo_text), _float(hi_text)
    if lo is None or hi is None:
        got = f"got {_cut(lo_text)!r} and {_cut(hi_text)!r}"
        raise _error(token, f"range ends must be numbers ({got}); expected name=lo..hi, {example}")
    scale, points = _parse_suffixes(token, example, suffixes)
    if lo > hi:
        tail = "".join(f":{suffix}" for suffix in suffixes)
        fix = _cut(f"{name}={hi_text}..{lo_text}{tail}")
        raise _error(token, f"the low end is above the high end; write {fix}")
    if scale == "log" and lo <= 0:
        fix = f"start the range above 0 or write {_cut(f'{name}={lo_text}..{hi_text}:lin')}"
        raise _error(token, f"':log' needs both ends above 0 (got {_cut(lo_text)}); {fix}")
    if points == 1 and lo < hi:
        fix = _cut(f"{name}={lo_text}")
        raise _error(token, f"one grid point cannot span a range; use :2 or more, or {fix}")
    if scale is None:
        scale = "log" if lo > 0 and hi / lo >= 10 else "lin"
    low_int, high_int = _int(lo_text), _int(hi_text)
    if low_int is None or high_int is None:
        return Param(name, "float", lo, hi, scale, points)
    if max(abs(low_int), abs(high_int)) > MAX_INT_END:
        raise _error(token, f"integer range ends must be within ±{MAX_INT_END:,}")
    return Param(name, "int", low_int, high_int, scale, points)


def _parse_suffixes(
    token: str, example: str, suffixes: list[str]
) -> tuple[Literal["log", "lin"] | None, int | None]:
    scale: Literal["log", "lin"] | None = None
    points: int | None = None
    for suffix in suffixes:
        word = suffix.strip().lower()
        if word in ("log", "lin"):
            if scale is not None:
                raise _error(token, f"the scale is given twice (:{scale} and :{word}); keep one")
            scale = "log" if word == "log" else "lin"
        elif _float(word) is not None:
            count = _int(word)
            if count is None or not 1 <= count <= MAX_POINTS:
                limits = f"a whole number from 1 to {MAX_POINTS:,}"
                raise _error(token, f"grid points (:{_cut(suffix)}) must be {limits}, {example}:5")
            if points is not None:
                twice = f"(:{points} and :{_cut(word)})"
                raise _error(token, f"grid points given twice {twice}; keep one")
            points = count
        else:
            what = "an empty ':'" if not word else f"unknown suffix ':{_cut(suffix)}'"
            raise _error(token, f"{what}; after a range write :log, :lin or :N, {example}:log:5")
    return scale, points


def _parse_choice(token: str, name: str, value: str) -> Param:
    items = [item.strip() for item in value.split(",")]
    if len(items) > MAX_CHOICES:
        fix = f"use a range, e.g. {_cut(name)}=lo..hi:N, or fewer values"
        raise _error(name, f"{len(items):,} values, over the limit of {MAX_CHOICES:,}; {fix}")
    kept = [item for item in items if item]
    if not kept:
        raise _error(token, f"no value; expected {FORMS}")
    if len(kept) < len(items):
        raise _error(token, f"an empty item; remove the extra comma: {_cut_choice(name, kept)}")
    firsts = dict.fromkeys(format_value(_typed(item)) for item in kept)
    if len(firsts) < len(kept):
        raise _error(token, f"an item is listed twice; write {_cut_choice(name, firsts)}")
    return Param(name, "choice", values=tuple(_typed(item) for item in kept))


def _grid_count(param: Param) -> int:
    if param.kind in ("choice", "const"):
        return len(param.values)
    lo, hi = param._ends()
    if lo == hi:
        return 1
    if param.kind == "int":
        # Linear points a step of 1 or more apart round to distinct integers; closer ones
        # round to every integer between the ends.
        span = int(hi) - int(lo) + 1
        return span if param.points is None else min(span, param.points)
    return max(param.points or DEFAULT_POINTS, 2)
