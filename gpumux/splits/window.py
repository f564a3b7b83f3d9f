"""A phase's measuring window, what the split search reads from the database: the phase's trials,
when the window closes, the per-trial rates in it, and the point it gives.

After N changes the device settles (`Timing.settle`), then a window opens over the phase's trials:
the workload's trials under N running when it opened, in auto sweeps (`sweep_fingerprint`), that
started in the phase (`phase_trials`). It closes once each has reported twice in it, half a
window apart, or ended (scripts that report too rarely or nothing: once every one has ended),
and one of them or of their refills computed beside N (below); one whose framework sees no GPU
closes none (`NoGpu`). The device's throughput at N is N times
the median trial's rate over its life, the phase's trials all read at the age of its youngest
(`trial_rates`): samples/s, optimizer steps/s
for PyTorch scripts that report no samples, completed trials/s for scripts that report neither
(one unit per workload). Each point keeps the trials it was measured on and the spread of their
rates: how sure it is; and, from the trials' reports over their lives (`steady_readings`), the
median of their steady rates, read while N trials computed on the device (`Computing`), and the
median of their start-ups, from which the search reads it at the work one trial of the sweep
does (`CurvePoint.at_work`). Until a trial of the phase, or one that refilled it, computed beside
N for half a window, the window stays open; where none did by the time every trial that began
before the phase's last ended has ended too (or as long again as the phase's trials ran), their
readings over all their reports stand. The start-ups of all the trials count.
"""

from __future__ import annotations

import itertools
import math
import statistics
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from gpumux.splits import curve as split_curve
from gpumux.storage import reports as report_store
from gpumux.storage.models import Sweep, Trial
from gpumux.throughput import (
    SAMPLES_PER_S,
    STEPS_PER_S,
    TRIALS_PER_S,
    CurvePoint,
    ThroughputUnit,
)


@dataclass(frozen=True)
class Timing:
    """How long the search waits: after N changes (settle), then measures (window)."""

    settle: timedelta
    window: timedelta
    threshold: float = split_curve.DEFAULT_THRESHOLD
    # Seconds between the scheduler's ticks: a trial launched in the tick a phase began
    # started up to a tick before the phase's stamp (`own_trials`).
    poll: timedelta = timedelta(seconds=1)

    @property
    def dip(self) -> timedelta:
        """How long a phase may be short of N and go on: until the next probe and the tick
        after it (NVML lists a trial that ended until then, and its refill waits for room)."""
        return 2 * self.poll

    @property
    def margin(self) -> timedelta:
        """How long before a phase's stamp a trial of its own may have started: the settle
        time, and never less than a tick (the settle time may be 0)."""
        return max(self.settle, self.poll)


# How far short of N the trials computing on the device may be for a span to count as N's: a
# tenth (at least none) may be starting up, or between a trial's end and its refill.
SHORT = 0.1


@dataclass(frozen=True)
class Steady:
    """One trial's steady rate while N compute (its count per second), its start-up (the
    seconds from its start to computing), and whether the rate was read while N computed for
    half a window at least (`Computing`; False: over fewer seconds, or over all its reports
    where none was)."""

    rate: float
    startup_s: float
    beside_n: bool = True


class Computing:
    """When trials computed on the device (`report_store.computing_spans`, any workload's),
    the N whose steady rate is read while that many compute at once (`SHORT` of it), and the
    seconds of such spans a rate needs (half a window: one tick's spacing is not a rate)."""

    def __init__(
        self, *, split: int, spans: Sequence[tuple[datetime, datetime | None]], least: float
    ) -> None:
        self.split = split
        self.least = least
        self._starts = sorted(first for first, _ in spans)
        self._ends = sorted(ended for _, ended in spans if ended is not None)

    @property
    def need(self) -> int:
        return max(1, math.ceil(self.split * (1 - SHORT)))

    def full(self, begin: datetime, end: datetime) -> bool:
        """Whether `need` trials at least computed throughout (`begin`, `end`]: the count
        drops only where a trial ends, so it is counted just after `begin` and at each end
        before `end` (one that ended at `end` computed up to it)."""
        inside = self._ends[bisect_right(self._ends, begin) : bisect_left(self._ends, end)]
        return all(self._count(at) >= self.need for at in [begin, *inside])

    def _count(self, at: datetime) -> int:
        """Trials computing at `at`: started by then, not ended by then."""
        return bisect_right(self._starts, at) - bisect_right(self._ends, at)


@dataclass(frozen=True)
class Window:
    """A closed measuring window: the per-trial rates in it, the trials that ended, and the
    steady readings of those trials and of the trials whose rates it holds."""

    rates: list[float]
    ended: list[Trial]
    steady: list[Steady] = field(default_factory=list)


@dataclass(frozen=True)
class NoGpu:
    """A trial of the phase whose framework sees no GPU (a CPU-only build): it trains on the
    host's CPU, and its rates say nothing of the GPU."""

    trial: Trial


def phase_window(
    *,
    session: Session,
    device: str,
    split: int,
    phase_start: datetime,
    now: datetime,
    node_id: int | None,
    fingerprint: str,
    auto: dict[int, bool],
    unit: ThroughputUnit,
    measured: bool,
    timing: Timing,
    alone: bool = True,
) -> tuple[Window | NoGpu | None, ThroughputUnit]:
    """The window to measure now over the phase that began at `phase_start` on the device
    (None: not yet), and the unit the workload is measured in from now on (`read_window`).

    It opens the settle time after the phase began. The phase's trials are the workload's
    (`fingerprint`) trials under N running when it opened, in auto sweeps; `auto` remembers
    whether each sweep seen runs the workload at auto. `alone`: the workload had a GPU to
    itself, so that N trials computing there are its N and a raised N's trials are read while
    N computed (with another's beside it, what each holds is its share; on the CPU, whose
    phases are never raised beside a lower N's trials, N may never compute at once: every span
    of a trial's reports counts).
    """
    start = phase_start + timing.settle
    if now - start < timing.window:
        return None, unit
    on = report_store.trials_at_split(
        session=session, device=device, split=split, since=start, node_id=node_id
    )
    trials = [t for t in on if runs_workload(t.sweep, fingerprint=fingerprint, auto=auto)]
    unseen = next((t for t in trials if t.no_gpu is not None), None)
    if unseen is not None:
        return NoGpu(trial=unseen), unit
    # The trials' readings span their lives: what computed beside them since the first began.
    began = min((t.started_at for t in trials if t.started_at is not None), default=start)
    return read_window(
        session=session,
        trials=trials,
        phase_start=phase_start,
        start=start,
        now=now,
        unit=unit,
        measured=measured,
        timing=timing,
        computing=(
            lambda: Computing(
                split=split,
                spans=report_store.computing_spans(
                    session=session, device=device, since=began, end=now, node_id=node_id
                ),
                least=timing.window.total_seconds() / 2,
            )
        )
        if alone
        else None,
    )


def runs_workload(sweep: Sweep, *, fingerprint: str, auto: dict[int, bool]) -> bool:
    """Whether the sweep runs the workload (`fingerprint`) at auto; `auto` remembers the answer
    for each sweep seen."""
    if sweep.id not in auto:
        auto[sweep.id] = sweep.split is None and sweep_fingerprint(sweep) == fingerprint
    return auto[sweep.id]


def sweep_fingerprint(sweep: Sweep) -> str:
    """The workload of a sweep: its directory, its command, and the parameters that cost."""
    return split_curve.workload_fingerprint([sweep.workdir, *sweep.command], sweep.param_tokens)


def read_window(
    *,
    session: Session,
    trials: Sequence[Trial],
    phase_start: datetime,
    start: datetime,
    now: datetime,
    unit: ThroughputUnit,
    measured: bool,
    timing: Timing,
    computing: Callable[[], Computing] | None = None,
) -> tuple[Window | None, ThroughputUnit]:
    """The window opened at `start` over the trials under N since then, in the phase that
    began at `phase_start`, if it closes now (None: not yet), and the unit the workload is
    measured in from now on. `measured`: the curve has points already (its unit is then the
    workload's); `computing`: when trials computed on the device, read as it may close (None:
    every span of a trial's reports counts)."""
    phase = phase_trials(trials, phase_start=phase_start, start=start, timing=timing)
    counted_now = counted_trials(trials, phase_start=phase_start, start=start, timing=timing)
    ended = [t for t in counted_now if t.ended_at is not None and t.ended_at <= now]
    done = {t.id for t in ended}

    def rates_in(unit: ThroughputUnit) -> dict[int, float]:
        return trial_rates(
            session=session,
            trials=trials,
            phase_start=phase_start,
            start=start,
            end=now,
            unit=unit,
            timing=timing,
        )

    rates = rates_in(unit)
    if not rates and only_steps(session=session, trials=trials, unit=unit, measured=measured):
        unit = STEPS_PER_S
        rates = rates_in(unit)
    closes = unit != TRIALS_PER_S and rates and all(t.id in rates or t.id in done for t in phase)
    if not closes and not (ended and all(t.id in done for t in phase)):
        return None, unit
    # The ended trials' too: one that reported too rarely for a rate in the window may have
    # reported twice over its life.
    ids = set(rates) | done
    steady = steady_readings(
        session=session,
        trials=trials,
        ids=ids,
        end=now,
        unit=unit,
        computing=None if computing is None else computing(),
    )
    waits = (
        unit != TRIALS_PER_S
        and steady
        and not any(reading.beside_n for reading in steady)
        and not _generation_over(phase, counted_now, now=now)
    )
    if waits:
        # A phase raised beside a lower N's trials: its few trials may have computed beside
        # fewer than N (those trials ended together, their refills starting up), each faster
        # than N let it. The refills compute beside N soon.
        return None, unit
    return Window(rates=list(rates.values()), ended=ended, steady=steady), unit


def _generation_over(phase: Sequence[Trial], counted: Sequence[Trial], *, now: datetime) -> bool:
    """Whether every trial of the phase has ended (a phase with none has nothing to wait for),
    and so has every trial the window counts that started before the last of them ended, or as
    long again as the phase's trials ran, from the first's start to the last's end, has passed
    since (one may never get past its start-up): a device that never had N computing by then
    (start-ups as long as the work, out of step) will not have them."""
    if not phase:
        return True
    ends = [t.ended_at for t in phase]
    if any(end is None or end > now for end in ends):
        return False
    last = max(end for end in ends if end is not None)
    first = min((t.started_at for t in phase if t.started_at is not None), default=last)
    if now - last >= last - first:
        return True
    return all(
        t.ended_at is not None and t.ended_at <= now
        for t in counted
        if t.started_at is not None and t.started_at <= last
    )


def phase_trials(
    trials: Sequence[Trial], *, phase_start: datetime, start: datetime, timing: Timing
) -> list[Trial]:
    """The trials a window opened at `start` waits for: those that started in its phase
    (`own_trials`); where none did, those that started before it, beside the last N's trials
    (nothing refilled the phase)."""
    own = own_trials(trials, phase_start=phase_start, start=start, timing=timing)
    return own or [t for t in trials if t.started_at is not None and t.started_at <= start]


def counted_trials(
    trials: Sequence[Trial], *, phase_start: datetime, start: datetime, timing: Timing
) -> list[Trial]:
    """The trials a window reads, the ended ones included: the phase's (`phase_trials`) and
    those started since the window opened (refills), but none that started before the phase
    where it has trials of its own, as `trial_rates` reads them."""
    own = own_trials(trials, phase_start=phase_start, start=start, timing=timing)
    if not own:
        return list(trials)
    ids = {t.id for t in own}
    return [t for t in trials if t.id in ids or (t.started_at is not None and t.started_at > start)]


def own_trials(
    trials: Sequence[Trial], *, phase_start: datetime, start: datetime, timing: Timing
) -> list[Trial]:
    """The trials that started in the phase that began at `phase_start`, by the window's
    opening at `start`. A trial launched in the tick the phase began started a moment before
    it (the filler launches it, then the search stamps the phase): `Timing.margin`, the settle
    time and never less than a tick, keeps it in."""
    since = phase_start - timing.margin
    return [t for t in trials if t.started_at is not None and since <= t.started_at <= start]


def trial_rates(
    *,
    session: Session,
    trials: Sequence[Trial],
    phase_start: datetime,
    start: datetime,
    end: datetime,
    unit: ThroughputUnit,
    timing: Timing,
) -> dict[int, float]:
    """Each trial's samples/s over its life, where it reported twice or more in the window
    opened at `start`, half a window apart at least (report lines read from a log in one tick
    arrive together: their spacing is the reading's, not the work's); a rate out of range is
    left out. The phase's trials (`phase_trials`) are read at one age, the least any of them
    had at its last report: what each reported from its start to then. A trial started since
    the window opened (a refill) is read at its own age, never past theirs; one that started
    before the phase, beside the last N's trials, is left out where the phase has trials of
    its own.

    Its life, not the span between its reports: a short trial spends much of it starting
    (TensorFlow's import alone takes seconds), and N trials that start together crowd each
    other's start-up as much as their training. N times a life rate counts both. At one age:
    the phase's trials need not have started together (one may have started in the settle
    time, seconds after the others), and an older trial's start-up weighs less in its longer
    life, so its life rate reads higher. Not at a refill's age: a refill is younger than the
    window, and its age would read the phase's trials over their start-up alone. An older
    trial is left out because at their age its reading would fall wholly or partly before
    the phase, under the last N's load, and over its own life its start-up, crowded by fewer
    trials, weighs less; where every trial of the phase is such a one (nothing refilled it),
    each is read over its own life, as a trial that started with the phase would be.
    """
    what = counted(unit)
    half = timing.window.total_seconds() / 2
    own = {t.id for t in own_trials(trials, phase_start=phase_start, start=start, timing=timing)}
    phase = own or {
        t.id for t in phase_trials(trials, phase_start=phase_start, start=start, timing=timing)
    }
    started = {
        t.id: t.started_at
        for t in trials
        if t.started_at is not None and (t.id in phase or t.started_at > start)
    }
    times = report_store.report_times(
        session=session, trial_ids=list(started), start=start, end=end, counted=what
    )
    measured = [
        trial_id
        for trial_id, reports in times.items()
        if len(reports) >= 2 and (reports[-1][0] - reports[0][0]).total_seconds() >= half
    ]
    if not measured:
        return {}
    lives = report_store.report_times(
        session=session,
        trial_ids=measured,
        start=min(started[trial_id] for trial_id in measured),
        end=end,
        counted=what,
    )
    own_age = {i: (times[i][-1][0] - started[i]).total_seconds() for i in measured}
    # The phase's own trials read at one age; trials that all started before it, each at its own.
    one_age = min((own_age[i] for i in measured if i in own), default=math.inf)
    rates = {}
    for trial_id in measured:
        age = min(one_age, own_age[trial_id])
        rate = (
            samples_by(lives[trial_id], began=started[trial_id], age=age) / age
            if age > 0
            else math.inf
        )
        if 0 <= rate <= report_store.MAX_RATE:
            rates[trial_id] = rate
    return rates


def steady_readings(
    *,
    session: Session,
    trials: Sequence[Trial],
    ids: Collection[int],
    end: datetime,
    unit: ThroughputUnit,
    computing: Computing | None = None,
) -> list[Steady]:
    """The steady reading of each trial of `ids`: its rate, the slope of its reports (lines
    read in one tick as one) from its first to its last by `end`, over its life rather than the
    window, as a longer span is less a tick's jitter; its start-up, its age at its first report
    less what that report counted at the pace of its next two (`_startup`). No reading for a
    trial whose reports came in one tick.

    With `computing`, the slope is taken over the spans between its reports while N trials at
    least computed on the device (`Computing.full`), where they last half a window
    (`Computing.least`, `beside_n`): a phase whose trials compute beside fewer (those of a lower
    N it was raised from end together, their refills start up) would read each trial faster
    than N let it. Over all its reports where they are shorter, `beside_n` False."""
    started = {t.id: t.started_at for t in trials if t.id in ids and t.started_at is not None}
    if not started:
        return []
    lives = report_store.report_times(
        session=session,
        trial_ids=list(started),
        start=min(started.values()),
        end=end,
        counted=counted(unit),
    )
    readings = []
    for trial_id, reports in lives.items():
        ticks = [
            (at, sum(count for _, count in read))
            for at, read in itertools.groupby(reports, key=lambda report: report[0])
        ]
        if len(ticks) < 2:
            continue
        spans = list(itertools.pairwise(ticks))
        full = (
            spans
            if computing is None
            else [(before, after) for before, after in spans if computing.full(before[0], after[0])]
        )
        beside = computing is None or (bool(full) and _seconds(full) >= computing.least)
        taken = full if beside else spans
        rate = sum(after[1] for _, after in taken) / _seconds(taken)
        if not 0 < rate <= report_store.MAX_RATE:
            continue
        readings.append(
            Steady(rate=rate, startup_s=_startup(ticks, started[trial_id], rate), beside_n=beside)
        )
    return readings


def _seconds(spans: Sequence[tuple[tuple[datetime, float], tuple[datetime, float]]]) -> float:
    return sum((after[0] - before[0]).total_seconds() for before, after in spans)


def _startup(ticks: Sequence[tuple[datetime, float]], began: datetime, rate: float) -> float:
    """A trial's start-up from its report ticks (when, how many; two at least): its age at
    its first report less what that report counted at the pace of its next two (its first
    steps, whoever computed beside them, not the rate read beside N), or at `rate` where they
    counted nothing."""
    (first, counted_first), *after = ticks
    age = (first - began).total_seconds()
    nearby = after[:2]
    counted_next = sum(count for _, count in nearby)
    pace = (nearby[-1][0] - first).total_seconds() / counted_next if counted_next > 0 else 1 / rate
    return min(age, max(0.0, age - counted_first * pace))


def samples_by(reports: Sequence[tuple[datetime, float]], *, began: datetime, age: float) -> float:
    """What a trial that started at `began` had reported `age` seconds later, from its reports
    in order (when, how many): interpolated between the reports either side of that age (lines
    read in one tick as one), from none at its start; all it reported if it is not that old."""
    done, then = 0.0, 0.0
    for at, read in itertools.groupby(reports, key=lambda report: report[0]):
        samples = sum(count for _, count in read)
        seconds = (at - began).total_seconds()
        if seconds > age:
            return done + samples * (age - then) / (seconds - then)
        done, then = done + samples, seconds
    return done


def counted(unit: ThroughputUnit) -> report_store.Counted:
    """What a unit counts in the reports."""
    return "steps" if unit == STEPS_PER_S else "samples"


def only_steps(
    *, session: Session, trials: Sequence[Trial], unit: ThroughputUnit, measured: bool
) -> bool:
    """Whether the workload, not measured yet, reported optimizer steps and no samples:
    then it is measured in steps/s from now on. Samples win: a script that reports them
    is measured in samples/s, whatever the runtime counted besides."""
    if unit != SAMPLES_PER_S or measured:
        return False
    ids = [t.id for t in trials]
    if any(report_store.samples_of(session=session, trial_ids=ids).values()):
        return False
    steps = report_store.samples_of(session=session, trial_ids=ids, counted="steps")
    return any(steps.values())


def measure(
    *,
    session: Session,
    window: Window,
    unit: ThroughputUnit,
    split: int,
    measured: bool,
    peak_mb: int | None,
) -> tuple[CurvePoint | None, ThroughputUnit]:
    """The device's throughput at N: N times the median trial's rate (each trial holds 1/N
    of the device, whatever shares the rest), or N over the median trial's duration; and
    the unit the workload is measured in from now on. No point: nothing in range was
    reported."""
    durations = [
        (t.ended_at - t.started_at).total_seconds()
        for t in window.ended
        if t.started_at is not None and t.ended_at is not None and t.ended_at > t.started_at
    ]
    per_trial = statistics.median(durations) if durations else None
    rates = window.rates
    if unit != TRIALS_PER_S and not rates:
        ended = [t.id for t in window.ended]
        if only_steps(session=session, trials=window.ended, unit=unit, measured=measured):
            unit = STEPS_PER_S
        totals = report_store.samples_of(session=session, trial_ids=ended, counted=counted(unit))
        if not any(totals.values()) and not measured:
            # A script that reports nothing: count finished trials instead, from now on.
            unit = TRIALS_PER_S
        # Trials that reported too rarely for a rate between reports: their samples over
        # their lives, start-up included, as a trial count would have it.
        rates = [
            rate
            for t in window.ended
            if t.started_at is not None
            and t.ended_at is not None
            and t.ended_at > t.started_at
            and 0
            < (rate := totals.get(t.id, 0.0) / (t.ended_at - t.started_at).total_seconds())
            <= report_store.MAX_RATE
        ]
    if unit != TRIALS_PER_S and rates:
        throughput = split * statistics.median(rates)
        how_far = spread(rates)
    elif unit == TRIALS_PER_S and per_trial is not None:
        throughput = split / per_trial
        how_far = spread(durations)
    else:
        # Nothing in range was reported (absurd sizes stored before they were bounded): such a
        # window tells nothing.
        return None, unit
    steady = window.steady if unit != TRIALS_PER_S else []
    # The rates read beside N where any were; every trial's start-up.
    beside = [r for r in steady if r.beside_n] or steady
    point = CurvePoint(
        split=split,
        throughput=throughput,
        seconds_per_trial=per_trial,
        memory_per_trial_mb=peak_mb,
        trials=len(rates) if unit != TRIALS_PER_S else len(durations),
        spread=how_far,
        rate=statistics.median(r.rate for r in beside) if beside else None,
        startup_s=statistics.median(r.startup_s for r in steady) if steady else None,
    )
    return point, unit


def timed_points(
    *,
    session: Session,
    curve: Sequence[CurvePoint],
    sweep_id: int,
    device: str,
    node_id: int | None,
) -> list[CurvePoint]:
    """The curve with each point measured before any of its trials ended (long trials: the
    window closed on their reports) given the median seconds of the sweep's trials that ran to
    their end under its N on the device."""
    if all(point.seconds_per_trial is not None for point in curve):
        return list(curve)
    times = report_store.run_times(
        session=session, sweep_id=sweep_id, device=device, node_id=node_id
    )
    return [
        point
        if point.seconds_per_trial is not None or not times.get(point.split)
        else replace(point, seconds_per_trial=statistics.median(times[point.split]))
        for point in curve
    ]


def spread(values: Sequence[float]) -> float | None:
    """How far apart the trials' figures of one point lie, relative to their median."""
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else None
