"""The online split search: measures one workload on one device while its sweep runs.

SplitSearches (splits.searches) keeps one SplitSearch per (device model, workload fingerprint)
for sweeps with `--split auto`. Each tick it reports the workload's trials running on the device
under the current N and what shares the device (a trial under N holds 1/N of it, so several
workloads mix). While the device is full, a phase runs: after it settles, each of the workload's
trials under N gives its samples/s between its reports, and the device's throughput at N is N
times the median trial's rate (optimizer steps/s for PyTorch scripts that report no samples,
completed trials/s for scripts that report neither; one unit per workload); with the
most memory one trial held, the point goes to the pure split search (curve) for the next N, and
the curve is stored as the workload's profile so that the workload's next sweep starts settled.

A workload whose framework sees no GPU on a GPU (a CPU-only build: its trials train on the host's
CPU) is not measured: the search stops for its sweep, saying why.

A point that cannot be beside the others (curve.implausible: each trial faster at a larger N, or
more than the cores that do the work allow) is not stored: it and the points it conflicts with are
measured again; after `MAX_REJECTED` such points the search stops for the sweep, unsettled and
saying why. Each point keeps the trials it was measured on and the spread of their rates, and a
sweep that ends before its search settled leaves a profile that says so, which the next sweep of
the workload goes on from.

A new search starts from the best prior there is: the workload's own profile (settled: its N;
else its curve), else the newest settled profile of the same command with other cost parameters
on the device model (its N), else the device kind's guess. A profile also keeps the N that ran
out of memory and a lowered ceiling, which the next search never climbs into.
"""

from __future__ import annotations

import logging
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from fractions import Fraction

from sqlalchemy.orm import Session

from gpumux.devices.kinds.base import FirstSplit
from gpumux.splits import curve as split_curve
from gpumux.storage import profiles as profile_store
from gpumux.storage import reports as report_store
from gpumux.storage.models import Profile, Sweep, Trial
from gpumux.storage.nodes import ThisNode
from gpumux.throughput import (
    SAMPLES_PER_S,
    STEPS_PER_S,
    SWEEP_ENDED,
    TRIALS_PER_S,
    CurvePoint,
    ThroughputUnit,
    throughput_unit,
)

log = logging.getLogger(__name__)

# Points that could not be, after which a search stops for its sweep: the host disturbs every
# window (other work, a loaded machine), and measuring on would only wander.
MAX_REJECTED = 3

# What TensorFlow, PyTorch, JAX and CUDA print when a process runs out of device memory.
OUT_OF_MEMORY = re.compile(
    r"ResourceExhaustedError|OOM when allocating|CUDA out of memory|out of memory|"
    r"RESOURCE_EXHAUSTED|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation",
)


def is_out_of_memory(log_tail: str) -> bool:
    """Whether a failed trial's last log lines say it ran out of device memory."""
    return OUT_OF_MEMORY.search(log_tail) is not None


@dataclass(frozen=True)
class Mix:
    """What shares a search's device at one tick, every workload's trials counted."""

    # The sum of 1/split over the trials active on the device: each holds 1/N of it.
    shares: Fraction
    # The workload's own trials there launched under another N (left from the last N).
    stale: int = 0
    # Whether a trial waits for a slot, and whether one would fit in the share left.
    waiting: bool = True
    fitting: bool = True
    # Whether another workload's trial waits for more than the share left: it may hold the
    # device reserved (placement's rule for a trial that fits nowhere), not memory.
    reserved: bool = False
    # Whether `queued` counts every trial of the workload that waits (the line was read whole).
    counted: bool = True

    @property
    def full(self) -> bool:
        """Whether the device holds all it can: every share taken, or none that waits fits."""
        return self.shares >= 1 or (self.waiting and not self.fitting)


@dataclass(frozen=True)
class Window:
    """A closed measuring window: the per-trial rates in it, and the trials that ended."""

    rates: list[float]
    ended: list[Trial]


@dataclass(frozen=True)
class Timing:
    """How long the search waits: after N changes (settle), then measures (window)."""

    settle: timedelta
    window: timedelta
    threshold: float = split_curve.DEFAULT_THRESHOLD


@dataclass
class SplitSearch:
    """The N for one workload on one device: being searched, or settled."""

    device_key: str
    device_name: str
    fingerprint: str
    command: list[str]
    cost_tokens: list[str]
    ceiling: int
    timing: Timing
    # The directory the command runs in: part of the workload, kept apart in its profile.
    workdir: str | None = None
    curve: list[CurvePoint] = field(default_factory=list)
    unit: ThroughputUnit = SAMPLES_PER_S
    oom_at: int | None = None
    decision: split_curve.Decision = field(
        default_factory=lambda: split_curve.Decision(split=1, settled=False, reason="measuring N=1")
    )
    phase_start: datetime | None = None
    filling_since: datetime | None = None
    sweep_id: int | None = None
    # The most memory one trial held while N of them ran in this phase (MiB).
    peak_mb: int | None = None
    # Where the search starts (`split_curve.start`), and the prior that put it there.
    start: int = 1
    origin: str = ""
    # A ceiling memory was seen to impose, lower than the device's: the profile keeps it.
    lowered: int | None = None
    # Whether each sweep seen on the device runs this workload at auto.
    _sweeps: dict[int, bool] = field(default_factory=dict, init=False, repr=False, compare=False)
    # The node whose device this is, on a database several nodes share (none: the only one).
    here: ThisNode = field(default_factory=ThisNode, repr=False, compare=False)
    # The cores that do the trials' work where the device is the host's CPU (None: a GPU).
    cores: int | None = None
    # Points that could not be, and why the search stopped for this sweep (None: it goes on).
    rejected: int = 0
    halted: str | None = None
    # Whether the profile says already that the sweep ended before the search settled.
    ended: bool = False
    # The sweep whose ended trials timed the points measured before any ended.
    timed: int | None = None
    # Whether another workload shared the device during the phase: its N is then this
    # workload's share, not the processes on the device, and no bound of N trials applies.
    mixed: bool = False

    @property
    def split(self) -> int:
        return self.decision.split

    @classmethod
    def resume(
        cls,
        *,
        session: Session,
        device_key: str,
        device_name: str,
        command: list[str],
        param_tokens: list[str],
        ceiling: int,
        timing: Timing,
        guess: FirstSplit | None = None,
        cores: int | None = None,
        workdir: str | None = None,
        here: ThisNode | None = None,
    ) -> SplitSearch:
        """A search for this workload, from the best prior: its stored profile, a similar
        workload's, else `guess` (the device kind's; none: from N=1)."""
        names = [token.partition("=")[0] for token in param_tokens]
        cost = set(split_curve.cost_parameters(names))
        search = cls(
            device_key=device_key,
            device_name=device_name,
            fingerprint=split_curve.workload_fingerprint(
                command if workdir is None else [workdir, *command], param_tokens
            ),
            command=list(command),
            workdir=workdir,
            cost_tokens=[t for t in param_tokens if t.partition("=")[0] in cost],
            ceiling=ceiling,
            timing=timing,
            cores=cores,
            here=here or ThisNode(),
        )
        profile = profile_store.get_profile(
            session=session, device_name=device_name, fingerprint=search.fingerprint
        )
        if profile is not None:
            search._resume_profile(profile, guess=guess)
        else:
            search._start_from_prior(session=session, guess=guess)
        if not search.decision.settled:
            search.decision = search._decide()
        log.info("device %s: %s", device_key, search.decision.reason)
        return search

    def _resume_profile(self, profile: Profile, *, guess: FirstSplit | None) -> None:
        """Go on from this workload's own profile: its N, else its curve, within its limits."""
        self.unit = throughput_unit(profile.unit)
        self.curve = [CurvePoint.from_json(point) for point in profile.curve]
        self.oom_at = profile.oom_at
        if profile.ceiling is not None:
            self.lowered = profile.ceiling
            self.ceiling = min(self.ceiling, profile.ceiling)
        top = split_curve.effective_ceiling(ceiling=self.ceiling, oom_at=self.oom_at)
        if profile.settled and profile.best_split is not None:
            best = min(profile.best_split, top)
            self.decision = split_curve.Decision(
                split=best,
                settled=True,
                reason=f"profile {profile.id} of this workload on {self.device_name}: N={best}",
            )
        elif self.curve:
            # Unsettled: the ascent goes on from the lowest N it measured.
            self._start_at(
                min(point.split for point in self.curve), f"profile {profile.id} of this workload"
            )
        elif guess is not None:
            self._start_at(guess.split, guess.why)

    def _start_from_prior(self, *, session: Session, guess: FirstSplit | None) -> None:
        """A workload never measured here: start where a similar one settled, else at `guess`."""
        similar = profile_store.similar_profile(
            session=session,
            device_name=self.device_name,
            workdir=self.workdir,
            command=self.command,
            fingerprint=self.fingerprint,
        )
        if similar is not None and similar.best_split is not None:
            tokens = " ".join(similar.param_tokens) or "no cost parameters"
            self._start_at(
                similar.best_split, f"profile {similar.id} of a similar workload ({tokens})"
            )
        elif guess is not None:
            self._start_at(guess.split, guess.why)

    def _start_at(self, split: int, origin: str) -> None:
        self.start = max(1, min(split, self.ceiling))
        self.origin = origin

    def observe(
        self,
        *,
        session: Session,
        now: datetime,
        running: int,
        queued: int,
        sweep_id: int,
        held: Sequence[int] = (),
        mix: Mix | None = None,
    ) -> None:
        """After a tick's placements: the workload's trials running on the device under the
        current N and queued, the memory (MiB) each running one holds where measured, and what
        shares the device (None: the workload has it to itself)."""
        if self.decision.settled or self.halted is not None:
            return
        self.sweep_id = sweep_id
        if mix is None:
            mix = Mix(
                shares=Fraction(min(running, self.split), self.split),
                stale=max(0, running - self.split),
                waiting=queued > 0,
                fitting=queued > 0,
            )
        if mix.counted and self._cannot_fill(left=running + mix.stale + queued):
            log.info("device %s: %s", self.device_key, self.decision.reason)
            return
        if mix.stale or not mix.full:
            self._filling(session=session, now=now, queued=queued, mix=mix)
        else:
            self.filling_since = None
        if running == 0 and mix.shares > 0 and not mix.stale:
            # Only other workloads hold the device: a phase pauses (its rates were taken while
            # the device was full, and its window may close), none begins.
            if self.phase_start is not None:
                self._close(session=session, now=now)
            return
        if running == 0 or mix.stale or not mix.full:
            # Trials of the last N still run, or the device has room it could fill (or the
            # sweep's tail leaves it): per-trial rates would not be those of a full device.
            self.phase_start = None
            return
        alone = mix.shares == Fraction(running, self.split)
        if self.phase_start is None:
            self.phase_start = now
            self.peak_mb = max(held, default=None)
            self.mixed = not alone
            return
        self.mixed = self.mixed or not alone
        if held:
            # What has to fit is the most one trial holds: the peak over the phase.
            self.peak_mb = max(self.peak_mb or 0, *held)
        self._close(session=session, now=now)

    def _close(self, *, session: Session, now: datetime) -> None:
        """Measure the phase's window if it can close now: a point on the curve, the next N."""
        window = self._window(session=session, now=now)
        if window is None:
            return
        point = self._measure(session=session, window=window)
        if point is None:
            return
        found = None if self.mixed else split_curve.implausible(self.curve, point, cores=self.cores)
        if found is not None:
            self._reject(*found)
            return
        self.ended = False
        self.curve = [p for p in self.curve if p.split != point.split] + [point]
        self.decision = self._decide()
        self.phase_start = None
        log.info(
            "device %s: N=%d gives %.4g %s; %s",
            self.device_key,
            point.split,
            point.throughput,
            self.unit,
            self.decision.reason,
        )

    def _cannot_fill(self, *, left: int) -> bool:
        """Whether the sweep's trials left here (running and queued) cannot fill the N the
        search measures next: it then settles on what it measured, saying so, rather than end
        unsettled (on a big GPU a first sweep has a few waves: the N above the last is rarely
        reachable, nor, after a few waves, an N below the start)."""
        if left >= self.split or not self.curve:
            return False
        measured = max(point.split for point in self.curve)
        decision = split_curve.next_split(
            self.curve,
            ceiling=measured,
            threshold=self.timing.threshold,
            oom_at=self.oom_at,
            start=self.start,
        )
        if self.split > measured:
            # A climb the trials left cannot reach: settled on what was measured, if the walk
            # capped there settles; else the search goes on as it decided.
            if not decision.settled:
                return False
            using = f"N={decision.split}, the best of {len(self.curve)} point(s) measured"
        else:
            # A descent or a bisection below the largest N measured: the smallest N measured
            # that does as well, as the finished search would settle on.
            split = split_curve.smallest_within(self.curve, threshold=self.timing.threshold)
            using = (
                f"N={split}, the smallest of {len(self.curve)} point(s) measured within "
                f"{self.timing.threshold:.0%} of the best"
            )
            decision = replace(decision, split=split, settled=True)
        self.phase_start = self.filling_since = None
        if self.start != 1:
            using = f"{using}; started at N={self.start}: {self.origin}"
        self.decision = replace(
            decision,
            reason=f"{left} trial(s) of the sweep left cannot fill N={self.split}: using {using}",
        )
        return True

    def _reject(self, why: str, conflicts: Sequence[int]) -> None:
        """A point that cannot be: neither it nor the points it conflicts with are kept; the
        search measures again, or stops for this sweep after `MAX_REJECTED` of them."""
        self.rejected += 1
        self.curve = [p for p in self.curve if p.split not in conflicts]
        self.phase_start = None
        self.decision = self._decide()
        if self.rejected >= MAX_REJECTED:
            self.halted = (
                f"unsettled: {self.rejected} points could not be (the last: {why}); "
                f"the next sweep measures again"
            )
            self.decision = replace(self.decision, reason=self.halted)
        log.warning(
            "device %s: %s, which cannot be: measured again; %s",
            self.device_key,
            why,
            self.decision.reason,
        )

    def _halt_without_gpu(self, trial: Trial) -> None:
        """The workload's framework sees no GPU (a CPU-only build): its trials train on the
        host's CPU, and their rates say nothing of the GPU. The search stops for the sweep at the
        N it had; the next sweep of the workload measures again."""
        self.phase_start = None
        self.halted = (
            f"unsettled: {trial.no_gpu} sees no GPU in trial {trial.id} (it trains on the CPU); "
            f"its throughput is not this GPU's, so N stays {self.split}"
        )
        self.decision = replace(self.decision, reason=self.halted)
        log.warning("device %s: %s", self.device_key, self.halted)

    @property
    def untimed(self) -> bool:
        """Whether the points have not been timed by the ended trials of the last sweep yet."""
        return self.sweep_id is not None and self.timed != self.sweep_id

    def time_trials(self, *, session: Session) -> bool:
        """Once its sweep is over, give each point measured before any of its trials ended
        (long trials: the window closes on their reports) the median seconds of the sweep's
        trials that ran to their end under its N here. True: a point changed."""
        sweep_id = self.sweep_id
        if sweep_id is None or self.timed == sweep_id:
            return False
        self.timed = sweep_id
        if all(point.seconds_per_trial is not None for point in self.curve):
            return False
        times = report_store.run_times(
            session=session, sweep_id=sweep_id, device=self.device_key, node_id=self.here.id
        )
        timed = [
            point
            if point.seconds_per_trial is not None or not times.get(point.split)
            else replace(point, seconds_per_trial=statistics.median(times[point.split]))
            for point in self.curve
        ]
        changed = timed != self.curve
        self.curve = timed
        return changed

    def sweep_ended(self, *, session: Session) -> bool:
        """The workload has nothing running or queued here and its sweep is over: an unsettled
        search says so in its profile (True: the profile needs saving), and the next sweep of
        the workload goes on from its curve, measuring again what could not be."""
        if self.decision.settled or self.ended:
            return False
        self.time_trials(session=session)
        self.ended = True
        # Why the search stopped, if it did, stays in the profile: a curve without points
        # says nothing by itself.
        why = "" if self.halted is None else f" ({self.halted.removeprefix('unsettled: ')})"
        self.rejected = 0
        self.halted = None
        self.phase_start = self.filling_since = None
        decision = self._decide()
        self.decision = replace(
            decision,
            reason=(
                f"{SWEEP_ENDED} after {len(self.curve)} point(s){why}, the next "
                f"sweep goes on from them; {decision.reason}"
            ),
        )
        return True

    def _filling(self, *, session: Session, now: datetime, queued: int, mix: Mix) -> None:
        """The workload's trial waits and its share is free, no other trial may hold the device
        reserved, yet none was placed: memory holds fewer than N; once that lasts the settle time
        and a window, lower the ceiling."""
        room = mix.shares + Fraction(1, self.split) <= 1
        if not (queued and room and not mix.reserved and not mix.stale):
            self.filling_since = None
        elif self.filling_since is None:
            self.filling_since = now
        elif now - self.filling_since > self.timing.settle + self.timing.window:
            fits = max(1, math.floor(mix.shares * self.split))
            self._hit_ceiling(session=session, fits=fits)

    def out_of_memory(self, *, session: Session, split: int) -> None:
        """A trial ran out of memory at N=`split`: that N and above are off the table."""
        self.oom_at = split if self.oom_at is None else min(self.oom_at, split)
        self.curve = [p for p in self.curve if p.split < self.oom_at]
        self.decision = self._decide()
        self.phase_start = None
        log.warning(
            "device %s: out of memory at N=%d; %s", self.device_key, split, self.decision.reason
        )
        self.save(session=session)

    def save(self, *, session: Session) -> None:
        """Store the curve, the decision and the limits memory set as this workload's profile
        on this device model."""
        best = self.decision.split if self.decision.settled else None
        profile_store.save_profile(
            session=session,
            device_name=self.device_name,
            fingerprint=self.fingerprint,
            workdir=self.workdir,
            command=self.command,
            param_tokens=self.cost_tokens,
            unit=self.unit,
            curve=[p.to_json() for p in sorted(self.curve, key=lambda p: p.split)],
            best_split=best,
            settled=self.decision.settled,
            reason=self.decision.reason,
            sweep_id=self.sweep_id,
            oom_at=self.oom_at,
            ceiling=self.lowered,
        )

    def _decide(self) -> split_curve.Decision:
        if self.oom_at == 1:
            return split_curve.Decision(
                split=1, settled=True, reason="out of memory even alone: N=1"
            )
        decision = split_curve.next_split(
            self.curve,
            ceiling=self.ceiling,
            threshold=self.timing.threshold,
            oom_at=self.oom_at,
            start=self.start,
        )
        if self.start == 1:
            return decision
        return replace(
            decision, reason=f"{decision.reason}; started at N={self.start}: {self.origin}"
        )

    def _window(self, *, session: Session, now: datetime) -> Window | None:
        """The window to measure now; None: not yet.

        It opens the settle time after the phase began. The phase's trials are the workload's
        trials under N running when it opened. It closes once each of them has reported twice in it
        (a rate between its reports) or ended, and at least one gave a rate; or, for scripts
        that report too rarely or nothing, once every one of them has ended.
        """
        assert self.phase_start is not None
        start = self.phase_start + self.timing.settle
        if now - start < self.timing.window:
            return None
        trials = [
            trial
            for trial in report_store.trials_at_split(
                session=session,
                device=self.device_key,
                split=self.split,
                since=start,
                node_id=self.here.id,
            )
            if self._ours(trial)
        ]
        unseen = next((t for t in trials if t.no_gpu is not None), None)
        if unseen is not None:
            self._halt_without_gpu(unseen)
            return None
        ended = [t for t in trials if t.ended_at is not None and t.ended_at <= now]
        phase = [t for t in trials if t.started_at is not None and t.started_at <= start]
        done = {t.id for t in ended}
        rates = self._rates(session=session, trials=trials, start=start, end=now)
        if not rates and self._only_steps(session=session, trials=trials):
            self.unit = STEPS_PER_S
            rates = self._rates(session=session, trials=trials, start=start, end=now)
        if (
            self.unit != TRIALS_PER_S
            and rates
            and all(t.id in rates or t.id in done for t in phase)
        ):
            return Window(rates=list(rates.values()), ended=ended)
        if ended and all(t.id in done for t in phase):
            return Window(rates=list(rates.values()), ended=ended)
        return None

    def _rates(
        self, *, session: Session, trials: Sequence[Trial], start: datetime, end: datetime
    ) -> dict[int, float]:
        """Each trial's samples/s over its life so far: what it reported in all over the time
        from its start to its last report, where it reported twice or more in the window, half
        a window apart at least (report lines read from a log in one tick arrive together:
        their spacing is the reading's, not the work's); a rate out of range is left out.

        Its life, not the span between its reports: a short trial spends much of it starting
        (TensorFlow's import alone takes seconds), and N trials that start together crowd each
        other's start-up as much as their training. N times a life rate counts both.
        """
        counted = self._counted()
        times = report_store.report_times(
            session=session, trial_ids=[t.id for t in trials], start=start, end=end, counted=counted
        )
        totals = report_store.samples_of(session=session, trial_ids=list(times), counted=counted)
        started = {t.id: t.started_at for t in trials}
        rates = {}
        for trial_id, reports in times.items():
            began = started.get(trial_id)
            if len(reports) < 2 or began is None:
                continue
            if (
                reports[-1][0] - reports[0][0]
            ).total_seconds() < self.timing.window.total_seconds() / 2:
                continue
            seconds = (reports[-1][0] - began).total_seconds()
            rate = totals.get(trial_id, 0.0) / seconds if seconds > 0 else math.inf
            if 0 <= rate <= report_store.MAX_RATE:
                rates[trial_id] = rate
        return rates

    def _counted(self) -> report_store.Counted:
        """What the search's unit counts in the reports."""
        return "steps" if self.unit == STEPS_PER_S else "samples"

    def _only_steps(self, *, session: Session, trials: Sequence[Trial]) -> bool:
        """Whether the workload, not measured yet, reported optimizer steps and no samples:
        then it is measured in steps/s from now on. Samples win: a script that reports them
        is measured in samples/s, whatever the runtime counted besides."""
        if self.unit != SAMPLES_PER_S or self.curve:
            return False
        ids = [t.id for t in trials]
        if any(report_store.samples_of(session=session, trial_ids=ids).values()):
            return False
        steps = report_store.samples_of(session=session, trial_ids=ids, counted="steps")
        return any(steps.values())

    def _ours(self, trial: Trial) -> bool:
        """Whether the trial is of this workload in an auto sweep."""
        sweep = trial.sweep
        if sweep.id not in self._sweeps:
            self._sweeps[sweep.id] = (
                sweep.split is None and sweep_fingerprint(sweep) == self.fingerprint
            )
        return self._sweeps[sweep.id]

    def _measure(self, *, session: Session, window: Window) -> CurvePoint | None:
        """The device's throughput at N: N times the median trial's rate (each trial holds 1/N
        of the device, whatever shares the rest), or N over the median trial's duration."""
        durations = [
            (t.ended_at - t.started_at).total_seconds()
            for t in window.ended
            if t.started_at is not None and t.ended_at is not None and t.ended_at > t.started_at
        ]
        per_trial = statistics.median(durations) if durations else None
        rates = window.rates
        if self.unit != TRIALS_PER_S and not rates:
            ended = [t.id for t in window.ended]
            if self._only_steps(session=session, trials=window.ended):
                self.unit = STEPS_PER_S
            totals = report_store.samples_of(
                session=session, trial_ids=ended, counted=self._counted()
            )
            if not any(totals.values()) and not self.curve:
                # A script that reports nothing: count finished trials instead, from now on.
                self.unit = TRIALS_PER_S
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
        if self.unit != TRIALS_PER_S and rates:
            throughput = self.split * statistics.median(rates)
            spread = _spread(rates)
        elif self.unit == TRIALS_PER_S and per_trial is not None:
            throughput = self.split / per_trial
            spread = _spread(durations)
        else:
            # Nothing in range was reported (absurd sizes stored before they were bounded):
            # such a window tells nothing; the phase starts again.
            log.warning("device %s: N=%d gave no finite throughput", self.device_key, self.split)
            self.phase_start = None
            return None
        return CurvePoint(
            split=self.split,
            throughput=throughput,
            seconds_per_trial=per_trial,
            memory_per_trial_mb=self.peak_mb,
            trials=len(rates) if self.unit != TRIALS_PER_S else len(durations),
            spread=spread,
        )

    def _hit_ceiling(self, *, session: Session, fits: int) -> None:
        # What held the trial back (memory, another workload, a user's running limit) may pass:
        # this sweep stays under it, the profile does not keep it.
        self.lower_ceiling(fits, why=f"only {fits} trial(s) fit at once", keep=False)

    def lower_ceiling(self, ceiling: int, *, why: str, keep: bool = True) -> None:
        """No N above `ceiling` will be tried (or kept): memory allows no more; `keep`: the
        profile keeps the ceiling, so that the next sweep of the workload stays under it."""
        self.ceiling = min(self.ceiling, ceiling)
        if keep:
            self.lowered = min(self.ceiling, self.lowered or self.ceiling)
        self.curve = [p for p in self.curve if p.split <= self.ceiling]
        self.decision = self._decide()
        self.filling_since = None
        log.warning("device %s: %s; %s", self.device_key, why, self.decision.reason)


def _spread(values: Sequence[float]) -> float | None:
    """How far apart the trials' figures of one point lie, relative to their median."""
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else None


def sweep_fingerprint(sweep: Sweep) -> str:
    """The workload of a sweep: its directory, its command, and the parameters that cost."""
    return split_curve.workload_fingerprint([sweep.workdir, *sweep.command], sweep.param_tokens)
