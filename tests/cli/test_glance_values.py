"""What the CLI shows at a glance, at any size: short parameter values that stay apart, and
learning curves of any step numbers."""

from __future__ import annotations

import io

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from gpumux.cli.curves import Curve, LearningChart
from gpumux.cli.glance import ShortValues, digits_to_tell_apart
from gpumux.schemas.trials import TrialPublic
from gpumux.status import TrialStatus

floats = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6)
close = st.builds(lambda base, step: [base + i * step for i in range(6)], floats, floats)


@given(st.lists(floats, max_size=30) | close)
def test_each_value_gets_the_digits_that_tell_it_from_all_the_others(values: list[float]) -> None:
    shown = ShortValues([{"lr": value} for value in values])
    for value in set(values):
        assert shown.digits[("lr", value)] == digits_to_tell_apart(value, values)


def test_values_shown_together_never_print_alike() -> None:
    values = [0.0123456, 0.0123499, 0.01235, 1e-3, 1.0000001e-3, 0.5]
    shown = ShortValues([{"lr": value} for value in values])
    printed = [shown.value("lr", value) for value in values]
    assert len(set(printed)) == len(values), printed


def test_a_curve_of_huge_step_numbers_is_drawn_from_the_steps_it_reported() -> None:
    trial = TrialPublic.model_construct(id=3, status=TrialStatus.succeeded, step=2**31 - 2)
    curve = Curve(trial=trial, values={0: 1.0, 2**30: 0.5, 2**31 - 2: 0.25})
    chart = LearningChart(curves=[curve], metric="loss", mode="min", best_id=3, reporting=1)
    console = Console(width=100, record=True, file=io.StringIO(), color_system=None)
    console.print(chart)
    (row,) = [line for line in console.export_text().splitlines() if line.startswith("trial 3")]
    cells = row.removeprefix("trial 3 ").rsplit(" 0.25", 1)[0]
    # Three reports, in the first, middle and last columns; blanks between.
    assert cells[0] != " " and cells[-1] != " " and len(cells.replace(" ", "")) == 3, row
