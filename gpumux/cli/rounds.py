"""The measurements of `gpumux tune`: one round per N, its throughput, and their table."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.table import Table

from gpumux.cli import plot, render
from gpumux.schemas.trials import TrialPublic
from gpumux.status import TrialStatus
from gpumux.throughput import SAMPLES_PER_S, TRIALS_PER_S, CurvePoint, ThroughputUnit


@dataclass(frozen=True)
class Round:
    """One N measured: how its R x N trials ended, how long the round took, what they reported."""

    split: int
    trials: int
    succeeded: int
    samples: float
    makespan_s: float | None
    seconds_per_trial: float | None
    errors: tuple[str, ...] = ()
    # The median share of a succeeded trial's time spent starting, and its seconds (None: not
    # measurable).
    startup_share: float | None = None
    startup_s: float | None = None

    @property
    def measured(self) -> bool:
        """At least one trial succeeded and the round took a measurable time."""
        return self.succeeded > 0 and bool(self.makespan_s)

    def throughput(self, unit: ThroughputUnit) -> float | None:
        """Samples (or succeeded trials) per second of the whole round; None when not measured."""
        if not self.measured or self.makespan_s is None:
            return None
        done = self.samples if unit == SAMPLES_PER_S else self.succeeded
        return done / self.makespan_s


def seconds(value: float | None) -> str:
    """A duration to the hundredth under ten seconds, where short rounds differ."""
    if value is not None and value < 10:
        return f"{value:.2f}s"
    return render.duration(value)


def measure_round(
    split: int,
    trials: Sequence[TrialPublic],
    samples: Mapping[int, float],
    startups: Mapping[int, float] | None = None,
    held: Mapping[int, float] | None = None,
) -> Round:
    """A round's figures from its ended trials, the samples each reported, the seconds each
    took to start, and the seconds each waited ready for the round before to end (launched
    ahead, overlap.py), where known (all by trial id). Waiting is no part of a trial's time:
    the round lasts from its first start to its last end less the wait of its last trial
    ready, as if it had been let compute then."""
    waited = held or {}
    ran = [t for t in trials if t.started_at is not None and t.ended_at is not None]
    makespan = None
    if ran:
        first = min(t.started_at for t in ran if t.started_at is not None)
        last = max(t.ended_at for t in ran if t.ended_at is not None)
        makespan = (last - first).total_seconds() - unheld(
            {t.id: waited[t.id] for t in ran if t.id in waited}
        )
    succeeded = [t for t in ran if t.status == TrialStatus.succeeded]
    durations = {
        t.id: (t.ended_at - t.started_at).total_seconds() - waited.get(t.id, 0.0)
        for t in succeeded
        if t.ended_at is not None and t.started_at is not None
    }
    known = startups or {}
    shares = [
        known[t.id] / durations[t.id] for t in succeeded if t.id in known if durations[t.id] > 0
    ]
    failed = [t for t in trials if t.status != TrialStatus.succeeded]
    return Round(
        split=split,
        trials=len(trials),
        succeeded=len(succeeded),
        samples=sum(samples.get(t.id, 0.0) for t in ran),
        makespan_s=makespan,
        seconds_per_trial=statistics.median(durations.values()) if durations else None,
        errors=tuple(
            f"trial {t.id} {t.status}: {render.error_summary(t.error) or 'no error recorded'}"
            for t in failed
        ),
        startup_share=statistics.median(shares) if shares else None,
        startup_s=_median([known[t.id] for t in succeeded if t.id in known]),
    )


def unheld(held: Mapping[int, float]) -> float:
    """Seconds a whole round waited ready: its last trial's wait (the others waited longer)."""
    return min(held.values(), default=0.0)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def choose_unit(rounds: Sequence[Round]) -> ThroughputUnit:
    """samples/s when every measured round reported samples; trials/s otherwise."""
    measured = [r for r in rounds if r.measured]
    if measured and all(r.samples > 0 for r in measured):
        return SAMPLES_PER_S
    return TRIALS_PER_S


def best_split(rounds: Sequence[Round], unit: ThroughputUnit) -> int | None:
    """The N with the highest throughput (the smaller N on a tie); None when none was measured."""
    measured = [(r.throughput(unit) or 0.0, -r.split) for r in rounds if r.measured]
    return -max(measured)[1] if measured else None


def results_table(rounds: Sequence[Round], *, unit: ThroughputUnit, best: int | None) -> Table:
    """A row per N: trials that succeeded, the round's time, throughput, speed-up, s/trial."""
    base = next((r.throughput(unit) for r in rounds if r.split == 1 and r.measured), None)
    table = Table(header_style="bold")
    table.add_column("N", justify="right", no_wrap=True, min_width=2)
    table.add_column("succeeded", justify="right", no_wrap=True)
    table.add_column("round", justify="right", no_wrap=True)
    table.add_column(unit, justify="right", no_wrap=True)
    table.add_column("speed-up", justify="right", no_wrap=True)
    table.add_column("s/trial", justify="right", no_wrap=True)
    table.add_column("", no_wrap=True)
    for measured in rounds:
        rate = measured.throughput(unit)
        if not measured.measured:
            note, style = "failed", "red"
        elif measured.split == best:
            note, style = "best", "bold green"
        else:
            note, style = "", ""
        table.add_row(
            str(measured.split),
            f"{measured.succeeded}/{measured.trials}",
            seconds(measured.makespan_s),
            plot.format_throughput(rate),
            render.NONE if rate is None or not base else f"{rate / base:.2f}x",
            seconds(measured.seconds_per_trial),
            note,
            style=style or None,
        )
    return table


def chart_points(rounds: Sequence[Round], unit: ThroughputUnit) -> list[CurvePoint]:
    """The measured rounds as points of the throughput curve."""
    return [
        CurvePoint(
            split=r.split,
            throughput=r.throughput(unit) or 0.0,
            seconds_per_trial=r.seconds_per_trial,
        )
        for r in rounds
        if r.measured
    ]
