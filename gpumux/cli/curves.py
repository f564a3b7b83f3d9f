"""Learning curves in the terminal: the objective against the step, one row of block characters
per trial on one scale, the best trial first and marked, as the dashboard draws them as lines."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

from gpumux.cli import render
from gpumux.cli.plot import eighths
from gpumux.client import Client
from gpumux.schemas.sweeps import SweepDetail
from gpumux.schemas.trials import TrialPublic
from gpumux.status import TrialStatus

# Rows drawn at most: each costs its trial's reports.
MAX_CURVES = 12
# From low to high, an eighth of a cell each (plot.eighths), and their ASCII stand-ins.
LEVELS = "▁▂▃▄▅▆▇█"
ASCII_LEVELS = "_.,-=+*#"
# Values spread over this factor or more, all above zero, are drawn on a log scale: a loss that
# falls from 2.4 to 0.03 would leave every good trial on the bottom line otherwise.
LOG_SPREAD = 10.0
MIN_COLUMNS = 8
# Columns of curve at most, wider terminals or not: a glance, not a plot.
MAX_COLUMNS = 40


@dataclass(frozen=True)
class Curve:
    """One trial's objective at each step it reported (steps from 0, as the API gives them)."""

    trial: TrialPublic
    values: Mapping[int, float]


def chosen_trials(sweep: SweepDetail, trials: Sequence[TrialPublic]) -> list[TrialPublic]:
    """The trials worth a curve: those that reported a step, the best first, then by objective."""
    stepped = [trial for trial in trials if trial.step is not None]
    ranked = render.rank_by_objective(stepped, sweep.objective)
    best = sweep.best.id if sweep.best is not None else None
    return sorted(ranked, key=lambda trial: trial.id != best)[:MAX_CURVES]


def fetch_curves(client: Client, sweep: SweepDetail, trials: Sequence[TrialPublic]) -> list[Curve]:
    """The objective at each step of the chosen trials' current attempts (a step sent twice:
    the last value)."""
    if sweep.objective is None:
        return []
    metric = sweep.objective.metric
    curves = []
    for trial in chosen_trials(sweep, trials):
        values: dict[int, float] = {}
        for report in client.all_reports(trial.id):
            value = report.metrics.get(metric)
            if report.attempt == trial.attempt and report.step is not None and value is not None:
                values[report.step] = value
        if values:
            curves.append(Curve(trial=trial, values=values))
    return curves


@dataclass(frozen=True)
class Scale:
    """Where a value sits between the lowest and highest drawn, linear or logarithmic."""

    low: float
    high: float
    log: bool

    @classmethod
    def of(cls, values: Sequence[float]) -> Scale:
        low, high = min(values), max(values)
        return cls(low=low, high=high, log=low > 0 and high / low >= LOG_SPREAD)

    def level(self, value: float) -> int:
        """0 for the lowest value drawn to 7 for the highest."""
        if self.high <= self.low:
            return len(LEVELS) // 2
        if self.log:
            span, above = math.log(self.high / self.low), math.log(value / self.low)
        else:
            span, above = self.high - self.low, value - self.low
        # The lowest value fills one eighth of the cell: eighths() never gives less.
        return min(len(LEVELS), eighths(above, span, 1)) - 1


@dataclass(frozen=True)
class LearningChart:
    """A row per trial: "trial 5 █▄▂▁▁▁▁▁▁▁ 0.0297 ◀ best", its columns the steps (several to a
    column when they outnumber the width), one scale for all rows."""

    curves: Sequence[Curve]
    metric: str
    mode: str
    best_id: int | None
    reporting: int

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        ascii_only = options.ascii_only
        levels = ASCII_LEVELS if ascii_only else LEVELS
        marker = " <- best" if ascii_only else " ◀ best"
        steps = max(step for curve in self.curves for step in curve.values) + 1
        scale = Scale.of([value for curve in self.curves for value in curve.values.values()])
        labels = [f"trial {curve.trial.id}" for curve in self.curves]
        lasts = [render.number(curve.values[max(curve.values)], digits=4) for curve in self.curves]
        label_w, last_w = max(map(len, labels)), max(map(len, lasts))
        fixed = label_w + 1 + 1 + last_w + max(len(marker), len(" pruned"))
        room = max(MIN_COLUMNS, min(MAX_COLUMNS, options.max_width - fixed))
        # Several steps to a column when they outnumber the room; a step several columns wide
        # when they are few, so that a short curve still reads as a curve.
        per_column = math.ceil(steps / room)
        repeat = max(1, room // steps)
        columns = math.ceil(steps / per_column)
        better = "lower" if self.mode == "min" else "higher"
        how = "log scale" if scale.log else "linear scale"
        shown = (
            f"the best {len(self.curves)} of {self.reporting} trials"
            if self.reporting > len(self.curves)
            else "each trial"
        )
        yield Text(
            f"{self.metric} against step ({better} is better; {how}, "
            f"{render.number(scale.low, digits=4)} to {render.number(scale.high, digits=4)}), "
            f"{shown} that reported steps",
            style="bold",
        )
        for curve, label, last in zip(self.curves, labels, lasts, strict=True):
            best = curve.trial.id == self.best_id
            pruned = curve.trial.status == TrialStatus.pruned
            line = Text(no_wrap=True, overflow="crop", style="bold green" if best else "")
            line.append(f"{label:>{label_w}} ")
            # Each column shows the last value the trial reported among the steps it covers
            # (the reported steps bucketed: a trial may report step 10**8 and few others).
            last_in: dict[int, float] = {}
            for step in sorted(step for step in curve.values if 0 <= step < steps):
                last_in[step // per_column] = curve.values[step]
            cells = [
                (levels[scale.level(last_in[column])] if column in last_in else " ") * repeat
                for column in range(columns)
            ]
            line.append("".join(cells), style="" if best else "cyan")
            line.append(f" {last:>{last_w}}")
            if best:
                line.append(marker)
            elif pruned:
                line.append(" pruned", style=render.STATUS_STYLES["pruned"])
            yield line
        end, width = str(steps), columns * repeat
        ticks = "1" + end.rjust(width - 1) if steps > 1 and width > len(end) else f"1-{end}"
        each = f", {per_column} to a column" if per_column > 1 else ""
        yield Text(f"{'':>{label_w}} {ticks} step{each}", style="dim")


def learning_chart(
    sweep: SweepDetail, trials: Sequence[TrialPublic], curves: Sequence[Curve]
) -> LearningChart | None:
    """The chart of these curves; None for a sweep with no objective or no trial with steps."""
    if sweep.objective is None or not curves:
        return None
    metric, mode = sweep.objective
    return LearningChart(
        curves=curves,
        metric=metric,
        mode=mode,
        best_id=sweep.best.id if sweep.best is not None else None,
        reporting=sum(trial.step is not None for trial in trials),
    )
