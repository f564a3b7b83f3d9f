from __future__ import annotations

import math
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumux.grammar.command import check_placeholders, render_command
from gpumux.grammar.sweepspec import (
    DEFAULT_POINTS,
    FORMS,
    GridTooLarge,
    Param,
    SpecError,
    Value,
    expand,
    format_param,
    format_value,
    grid_size,
    parse_param,
    parse_params,
)

# --- the forms, by example -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "param"),
    [
        ("lr=1e-3..1e-1", Param("lr", "float", 0.001, 0.1, "log")),
        ("lr=1e-3..1e-1:log:5", Param("lr", "float", 0.001, 0.1, "log", 5)),
        ("lr=1e-3..1e-1:5:log", Param("lr", "float", 0.001, 0.1, "log", 5)),
        ("lr=0.1..0.9:lin", Param("lr", "float", 0.1, 0.9, "lin")),
        ("lr=0.1..0.9", Param("lr", "float", 0.1, 0.9, "lin")),
        ("lr=0.001..0.009", Param("lr", "float", 0.001, 0.009, "lin")),
        ("lr=0.001..0.01", Param("lr", "float", 0.001, 0.01, "log")),
        ("x=-1..1.5", Param("x", "float", -1.0, 1.5, "lin")),
        ("x=0.5..0.5", Param("x", "float", 0.5, 0.5, "lin")),
        ("layers=2..6", Param("layers", "int", 2, 6, "lin")),
        ("units=16..512:log:6", Param("units", "int", 16, 512, "log", 6)),
        ("units=16..512", Param("units", "int", 16, 512, "log")),
        ("depth=-3..-1", Param("depth", "int", -3, -1, "lin")),
        ("bs=32,64,128", Param("bs", "choice", values=(32, 64, 128))),
        ("mix=1,0.5,adam", Param("mix", "choice", values=(1, 0.5, "adam"))),
        ("bs= 32, 64 ", Param("bs", "choice", values=(32, 64))),
        ("opt=adam", Param("opt", "const", values=("adam",))),
        ("epochs=10", Param("epochs", "const", values=(10,))),
        ("wd=1e-4", Param("wd", "const", values=(0.0001,))),
        ("act=nan", Param("act", "const", values=("nan",))),
        ("data=../data", Param("data", "const", values=("../data",))),
        ("expr=a=b", Param("expr", "const", values=("a=b",))),
        ("batch-size=8", Param("batch-size", "const", values=(8,))),
        ("_x=1", Param("_x", "const", values=(1,))),
    ],
)
def test_parse_param_forms(token: str, param: Param) -> None:
    assert parse_param(token) == param


@pytest.mark.parametrize(
    ("token", "grid"),
    [
        ("lr=1e-3..1e-1:log:3", (0.001, 0.01, 0.1)),
        ("lr=1e-3..1e-1", (0.001, 0.00316227766, 0.01, 0.0316227766, 0.1)),
        ("lr=0.1..0.9", (0.1, 0.3, 0.5, 0.7, 0.9)),
        ("lr=0..1.0:3", (0.0, 0.5, 1.0)),
        ("n=0..1:3", (0, 1)),
        ("x=0.5..0.5:9", (0.5,)),
        ("layers=2..6", (2, 3, 4, 5, 6)),
        ("layers=2..6:3", (2, 4, 6)),
        ("layers=2..4:10", (2, 3, 4)),
        ("units=16..512:log:6", (16, 32, 64, 128, 256, 512)),
        ("units=16..512:lin:3", (16, 264, 512)),
        ("n=1..1", (1,)),
        ("bs=32,64,128", (32, 64, 128)),
        ("opt=adam", ("adam",)),
    ],
)
def test_grid_values(token: str, grid: tuple[Value, ...]) -> None:
    values = parse_param(token).grid_values()
    assert values == grid
    assert [type(v) for v in values] == [type(v) for v in grid]


def test_float_range_default_points() -> None:
    assert len(parse_param("lr=0.1..0.2").grid_values()) == DEFAULT_POINTS


# --- errors: each names the token and says how to fix it -------------------------------------


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (
            "lr=1e-3...1e-1",
            "lr=1e-3...1e-1: '...' is not a range; write a range with two dots: lr=1e-3..1e-1",
        ),
        ("lr=", f"lr=: no value; expected {FORMS}"),
        ("=3", "=3: no parameter name; expected name=value, e.g. lr=3"),
        (
            "lr=a..b",
            "lr=a..b: range ends must be numbers (got 'a' and 'b'); "
            "expected name=lo..hi, e.g. lr=1e-3..1e-1",
        ),
    ],
)
def test_error_messages_exact(token: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_param(token)
    assert str(caught.value) == message
    assert caught.value.token == token


@pytest.mark.parametrize(
    ("token", "fix"),
    [
        ("lr", "expected name=value"),
        ("python", "put '--' before it"),
        ("-v", "options go before the parameters"),
        ("lr:0.1", "write '=' between name and value: lr=0.1"),
        ("--lr=0.1", "drop the leading dashes (gpumux adds them): lr=0.1"),
        ("1lr=2", "use letters, digits, '_' and '-', starting with a letter or '_'"),
        ("model.lr=2", "'model.lr' is not a parameter name"),
        ("lr=  ", "no value; expected name=value"),
        (
            "lr=1e-3....1e-1:log",
            "'....' is not a range; write a range with two dots: lr=1e-3..1e-1:log",
        ),
        ("lr=0.1..0.5,0.9", "write a range or a choice, not both: lr=lo..hi or lr=a,b,c"),
        ("lr=1..5..10", "for N grid points add :N, e.g. lr=1..10:5"),
        ("lr=..0.1", "a range needs both ends; expected name=lo..hi, e.g. lr=1e-3..1e-1"),
        ("lr=0.1..", "a range needs both ends"),
        ("lr=1e-3..inf", "range ends must be numbers (got '1e-3' and 'inf')"),
        ("lr=1..1e999", "range ends must be numbers"),
        ("lr=0.1..0.2:foo", "unknown suffix ':foo'; after a range write :log, :lin or :N"),
        ("lr=0.1..0.2:", "an empty ':'; after a range write :log, :lin or :N"),
        ("lr=0.1..0.2:0", "grid points (:0) must be a whole number from 1 to 100,000"),
        ("lr=0.1..0.2:-3", "grid points (:-3) must be a whole number"),
        ("lr=0.1..0.2:2.5", "grid points (:2.5) must be a whole number"),
        ("lr=0.1..0.2:1000000", "grid points (:1000000) must be a whole number from 1 to 100,000"),
        ("lr=0.1..0.2:3:4", "grid points given twice (:3 and :4); keep one"),
        ("lr=0.1..0.2:log:lin", "the scale is given twice (:log and :lin); keep one"),
        ("lr=0.1..0.2:1", "one grid point cannot span a range; use :2 or more, or lr=0.1"),
        ("lr=1e-1..1e-3:log", "the low end is above the high end; write lr=1e-3..1e-1:log"),
        ("n=6..2", "the low end is above the high end; write n=2..6"),
        ("lr=0..1:log", "':log' needs both ends above 0 (got 0); start the range above 0"),
        ("x=-5..-1:log", "or write x=-5..-1:lin"),
        ("n=1..99999999999999999", "integer range ends must be within ±9,007,199,254,740,992"),
        ("opt=adam:log", "':log' applies only to a range, e.g. opt=1e-3..1e-1:log"),
        ("bs=32,,64", "an empty item; remove the extra comma: bs=32,64"),
        ("bs=32,64,", "an empty item; remove the extra comma: bs=32,64"),
        ("bs=32,", "an empty item; remove the extra comma: bs=32"),
        ("bs=,", "no value; expected name=value"),
        ("bs=32,64,32", "an item is listed twice; write bs=32,64"),
        ("bs=1.0,1.00", "an item is listed twice; write bs=1.0"),
    ],
)
def test_error_names_token_and_fix(token: str, fix: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_param(token)
    assert str(caught.value).startswith(f"{token}: ")
    assert fix in str(caught.value)
    assert caught.value.token == token


def test_spec_error_is_value_error() -> None:
    with pytest.raises(ValueError, match="no value"):
        parse_param("lr=")


# --- several tokens ---------------------------------------------------------------------------


def test_parse_params_keeps_order() -> None:
    params = parse_params(["lr=1e-3..1e-1", "bs=32,64", "opt=adam"])
    assert [p.name for p in params] == ["lr", "bs", "opt"]
    assert parse_params([]) == []


@pytest.mark.parametrize(
    ("tokens", "token", "message"),
    [
        (
            ["lr=0.1", "bs=32", "lr=0.2"],
            "lr=0.2",
            "lr=0.2: lr given twice (also lr=0.1); for several values write one choice: lr=0.1,0.2",
        ),
        (["lr=1,2", "lr=2,3"], "lr=2,3", "for several values write one choice: lr=1,2,3"),
        (["lr=1..2", "lr=3..4"], "lr=3..4", "lr=3..4: lr given twice (also lr=1..2); keep one"),
        (["bs=32,", "64"], "bs=32,", "bs=32, 64: a space splits this value in two; write bs=32,64"),
        (["bs=32", ",64"], "bs=32", "write bs=32,64"),
        (["lr=1e-3..", "1e-1"], "lr=1e-3..", "write lr=1e-3..1e-1"),
        (["lr=", "0.1", "bs=2"], "lr=", "lr= 0.1: a space splits this value in two; write lr=0.1"),
    ],
)
def test_parse_params_errors(tokens: list[str], token: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_params(tokens)
    assert message in str(caught.value)
    assert caught.value.token == token


def test_parse_params_reports_the_bad_token() -> None:
    with pytest.raises(SpecError) as caught:
        parse_params(["lr=0.1", "python", "train.py"])
    assert caught.value.token == "python"
    assert "put '--' before it" in str(caught.value)


LONG = "a" * 8_000
DIGITS = "0" * 8_000


@pytest.mark.parametrize(
    "tokens",
    [
        ["x" * 16_000],
        ["=" + "1" * 16_000],
        [f"{LONG}:1"],
        [f"--{LONG}=1"],
        ["a b" * 4_000 + "=1"],
        [f"{LONG}=1:log"],
        [f"{LONG}=", "1"],
        [f"{LONG}=1", f"{LONG}=2"],
        [f"a={LONG}", f"a={LONG}b"],
        [f"x=1{'.' * 8_000}2"],
        [f"{LONG}=1..2..3"],
        [f"{LONG}=1,2..3"],
        [f"{LONG}=..2"],
        [f"x={LONG}..2"],
        [f"x=2.{DIGITS}..1.{DIGITS}"],
        [f"x=-0.{DIGITS}1..2:log"],
        [f"x=0.{DIGITS}1..2:1"],
        [f"{LONG}=1..2:log:lin"],
        [f"x=1..2:{DIGITS}"],
        [f"x=1..2:5:{DIGITS}5"],
        [f"x=1..2:{LONG}"],
        [f"{LONG}=0..99999999999999999999"],
        [f"{LONG}=1,,2"],
        [f"x={LONG},{LONG}"],
        ["a" * 14_000 + "=" + ",".join(["1"] * 1_001)],
        ["a" * 20_000 + "=1"],
    ],
)
def test_an_error_quotes_a_long_token_cut_short(tokens: list[str]) -> None:
    with pytest.raises(SpecError) as caught:
        parse_params(tokens)
    message = str(caught.value)
    assert len(message) < 400, message[:400]
    assert "…" in message


def test_a_placeholder_error_quotes_names_cut_short() -> None:
    names = [f"p{i}{LONG}" for i in range(3)]
    with pytest.raises(SpecError) as caught:
        check_placeholders(["run", "{" + LONG + "}"], names)
    assert len(str(caught.value)) < 400


# --- expansion ---------------------------------------------------------------------------------


def test_grid_order_first_param_slowest() -> None:
    params = parse_params(["a=1,2", "b=x,y,z", "c=0"])
    assert expand(params, trials=None, seed=0, max_grid=100) == [
        {"a": a, "b": b, "c": 0} for a in (1, 2) for b in ("x", "y", "z")
    ]


def test_grid_too_large() -> None:
    params = parse_params(["a=1..25", "b=1..25", "c=1..25"])
    assert grid_size(params) == 15_625
    with pytest.raises(GridTooLarge) as caught:
        expand(params, trials=None, seed=0, max_grid=10_000)
    assert str(caught.value) == (
        "the grid has 15,625 trials, over the limit of 10,000; "
        "use --trials K for a random search or fewer grid points (:N)"
    )
    assert (caught.value.size, caught.value.limit) == (15_625, 10_000)
    assert isinstance(caught.value, SpecError)
    assert len(expand(params, trials=None, seed=0, max_grid=15_625)) == 15_625


def test_grid_size_does_not_expand() -> None:
    assert grid_size(parse_params(["a=0..999999999999", "b=1,2"])) == 2 * 10**12


def test_no_params() -> None:
    assert expand([], trials=None, seed=0, max_grid=1) == [{}]
    assert expand([], trials=3, seed=0, max_grid=1) == [{}, {}, {}]
    assert grid_size([]) == 1


@pytest.mark.parametrize("trials", [0, -2])
def test_trials_below_one(trials: int) -> None:
    with pytest.raises(SpecError) as caught:
        expand(parse_params(["lr=0.1"]), trials=trials, seed=0, max_grid=10)
    assert str(caught.value) == (
        f"--trials {trials}: a random search needs at least 1 trial; use --trials 1 or more"
    )


def test_random_search_ignores_grid_limit_and_keeps_types() -> None:
    params = parse_params(["lr=1e-5..1e-1", "n=1..1000", "bs=32,64", "opt=adam", "k=1..4"])
    trials = expand(params, trials=200, seed=7, max_grid=1)
    assert len(trials) == 200
    assert all(isinstance(t["lr"], float) and isinstance(t["n"], int) for t in trials)
    assert {t["bs"] for t in trials} == {32, 64}
    assert {t["opt"] for t in trials} == {"adam"}
    assert {t["k"] for t in trials} == {1, 2, 3, 4}


def test_log_sampling_is_log_uniform() -> None:
    lr = parse_param("lr=1e-6..1")
    draws = [lr.sample(random.Random(seed)) for seed in range(400)]
    below = sum(1 for d in draws if isinstance(d, float) and d < 1e-3)
    # Half the log-range lies below 1e-3; a linear draw would land there 0.1% of the time.
    assert 150 < below < 250


def test_constants_consume_no_randomness() -> None:
    def draws(tokens: list[str]) -> list[Value]:
        return [t["a"] for t in expand(parse_params(tokens), trials=5, seed=3, max_grid=1)]

    assert draws(["c=7", "a=0..1.0"]) == draws(["a=0..1.0", "c=7"]) == draws(["a=0..1.0"])
    assert len(set(draws(["a=0..1.0"]))) == 5


# --- rendering ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.001, "0.001"), (64, "64"), ("adam", "adam"), (1.0, "1.0"), (1e-05, "1e-05"), (-2, "-2")],
)
def test_format_value(value: Value, text: str) -> None:
    assert format_value(value) == text


def test_render_command_appends_flags_in_param_order() -> None:
    argv = render_command(["python", "train.py"], {"lr": 0.001, "bs": 64, "opt": "adam"})
    assert argv == ["python", "train.py", "--lr=0.001", "--bs=64", "--opt=adam"]


def test_render_command_fills_placeholders() -> None:
    argv = render_command(
        ["python", "train.py", "--learning-rate={lr}", "out/{opt}-{lr}", '{"seed": 1}', "{other}"],
        {"lr": 0.001, "bs": 64, "opt": "adam"},
    )
    assert argv == [
        "python",
        "train.py",
        "--learning-rate=0.001",
        "out/adam-0.001",
        '{"seed": 1}',
        "{other}",
        "--bs=64",
    ]


def test_render_command_does_not_rescan_values() -> None:
    assert render_command(["{a}", "{b}"], {"a": "{b}", "b": "x"}) == ["{b}", "x"]


# --- properties --------------------------------------------------------------------------------

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
spans = st.tuples(finite, finite).map(sorted)
points = st.none() | st.integers(min_value=2, max_value=40)
scales = st.sampled_from(["", ":lin"])


def _range_token(lo: float, hi: float, scale: str, n: int | None) -> str:
    return f"x={format_value(lo)}..{format_value(hi)}{scale}" + ("" if n is None else f":{n}")


@given(spans, scales, points)
def test_float_grid_within_bounds_with_both_ends(
    span: list[float], scale: str, n: int | None
) -> None:
    lo, hi = span
    values = parse_param(_range_token(lo, hi, scale, n)).grid_values()
    assert values[0] == lo and values[-1] == hi
    assert list(values) == sorted(set(values))
    assert all(isinstance(v, float) and lo <= v <= hi for v in values)
    assert len(values) <= (n or DEFAULT_POINTS)


@given(
    st.floats(min_value=1e-8, max_value=1e3),
    st.floats(min_value=10, max_value=1e6),
    st.integers(min_value=3, max_value=20),
)
def test_log_grid_is_geometric(lo: float, factor: float, n: int) -> None:
    hi = lo * factor
    values = parse_param(_range_token(lo, hi, ":log", n)).grid_values()
    assert len(values) == n
    floats = [float(v) for v in values]
    ratios = [b / a for a, b in zip(floats, floats[1:], strict=False)]
    assert all(math.isclose(r, factor ** (1 / (n - 1)), rel_tol=1e-8) for r in ratios)


@given(
    st.integers(min_value=-1000, max_value=1000),
    st.integers(min_value=0, max_value=2000),
    st.sampled_from(["", ":lin", ":log"]),
    points,
)
def test_int_grid(lo: int, span: int, scale: str, n: int | None) -> None:
    hi = lo + span
    if scale == ":log" and lo <= 0:
        lo, hi = 1, span + 1
    param = parse_param(f"n={lo}..{hi}{scale}" + ("" if n is None else f":{n}"))
    values = param.grid_values()
    assert param.kind == "int"
    if n is None:
        assert values == tuple(range(lo, hi + 1))
    assert values[0] == lo and values[-1] == hi
    assert list(values) == sorted(set(values))
    assert all(isinstance(v, int) and lo <= v <= hi for v in values)


def _param_tokens(name: str) -> st.SearchStrategy[str]:
    small_int = st.integers(min_value=-5, max_value=5)
    return st.one_of(
        st.builds(lambda lo, s: f"{name}={lo}..{lo + s}", small_int, st.integers(0, 4)),
        st.builds(lambda n: f"{name}=1e-4..1e-1:{n}", st.integers(2, 4)),
        st.builds(lambda k: f"{name}=" + ",".join(f"v{i}" for i in range(k)), st.integers(2, 4)),
        st.just(f"{name}=adam"),
    )


param_lists = st.integers(min_value=0, max_value=4).flatmap(
    lambda k: st.tuples(*(_param_tokens(f"p{i}") for i in range(k)))
)


@given(param_lists)
def test_grid_size_matches_expansion(tokens: tuple[str, ...]) -> None:
    params = parse_params(tokens)
    trials = expand(params, trials=None, seed=0, max_grid=10**6)
    assert grid_size(params) == len(trials)
    assert len({tuple(t.items()) for t in trials}) == len(trials)
    assert all(list(t) == [p.name for p in params] for t in trials)


ranges = st.one_of(
    st.builds(lambda s, sc: _range_token(s[0], s[1], sc, None), spans, scales),
    st.builds(
        lambda lo, s: f"x={lo}..{lo + s}", st.integers(-(10**6), 10**6), st.integers(0, 10**6)
    ),
    st.builds(lambda lo, f: f"x={lo}..{lo * f}:log", st.integers(1, 1000), st.integers(1, 1000)),
)


@given(ranges, st.integers())
def test_random_draws_within_bounds_and_reproducible(token: str, seed: int) -> None:
    param = parse_param(token)
    draws = expand([param], trials=20, seed=seed, max_grid=1)
    assert draws == expand([param], trials=20, seed=seed, max_grid=1)
    for draw in draws:
        value = draw["x"]
        assert isinstance(value, float if param.kind == "float" else int)
        assert param.low is not None and param.high is not None
        assert param.low <= value <= param.high


@given(st.integers(), st.integers(), st.sampled_from(["x=0..1.0", "x=1e-6..1", "x=0..1000000"]))
def test_random_draws_differ_across_seeds(a: int, b: int, token: str) -> None:
    if a == b:
        b = a + 1
    params = [parse_param(token)]
    assert expand(params, trials=10, seed=a, max_grid=1) != expand(
        params, trials=10, seed=b, max_grid=1
    )


@given(finite)
def test_float_values_round_trip(value: float) -> None:
    (parsed,) = parse_param(f"x={format_value(value)}").values
    assert isinstance(parsed, float) and parsed == value


@given(st.integers())
def test_int_values_round_trip(value: int) -> None:
    assert parse_param(f"x={format_value(value)}").values == (value,)


@given(st.from_regex(r"[a-z_][a-z0-9_/-]{0,10}", fullmatch=True))
def test_string_values_round_trip(value: str) -> None:
    assert parse_param(f"x={value}").values == (value,)


@given(st.one_of(ranges, _param_tokens("x")))
def test_format_param_round_trips(token: str) -> None:
    param = parse_param(token)
    assert parse_param(format_param(param)) == param


names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,6}", fullmatch=True)
values = st.one_of(st.integers(), finite, st.text(max_size=8))


@given(
    st.dictionaries(names, values, max_size=6),
    st.lists(st.one_of(st.text(max_size=8), names.map(lambda n: "{" + n + "}")), max_size=6),
)
def test_render_command_never_drops_or_duplicates(
    params: dict[str, Value], command: list[str]
) -> None:
    argv = render_command(command, params)
    placed = {n for n in params if any("{" + n + "}" in arg for arg in command)}
    assert argv[len(command) :] == [
        f"--{n}={format_value(v)}" for n, v in params.items() if n not in placed
    ]
    for arg, rendered in zip(command, argv, strict=False):
        expected = re.sub(
            r"\{([A-Za-z_][A-Za-z0-9_-]*)\}",
            lambda m: format_value(params[m.group(1)]) if m.group(1) in params else m.group(0),
            arg,
        )
        assert rendered == expected


grammar_text = st.text(alphabet="lr_-=.,:0123456789eE+ login/ab\\", max_size=24)


@settings(max_examples=300)
@given(st.one_of(st.text(max_size=30), grammar_text))
def test_any_token_parses_or_raises_spec_error(token: str) -> None:
    try:
        param = parse_param(token)
    except SpecError as error:
        assert error.token == token and str(error).startswith(f"{token}: ")
        return
    rng = random.Random(0)
    param.sample(rng)
    if grid_size([param]) <= 10_000:
        # Points that rounding merges are counted in the size, never the other way round.
        assert len(param.grid_values()) <= grid_size([param])


@given(st.lists(st.one_of(st.text(max_size=10), grammar_text), max_size=4))
def test_any_token_list_parses_or_raises_spec_error(tokens: list[str]) -> None:
    try:
        params = parse_params(tokens)
    except SpecError as error:
        assert error.token in tokens
        return
    assert len({p.name for p in params}) == len(tokens)
