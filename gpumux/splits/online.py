"""The online split search: measures one workload on one device while its sweep runs.

SplitSearches (splits.searches) keeps one SplitSearch per (device model, workload fingerprint)
for sweeps with `--split auto`. Each tick it reports the workload's trials running on the device
under the current N and what shares the device (splits.mix: a trial under N holds 1/N of it, so
several workloads mix). While the device is full, a phase runs: after it settles, its window
(splits.window) gives the device's throughput at N, every point read at what one trial of the
sweep does (its start-up weighs less the more trials share it; `CurvePoint.at_work`), all of
them again each time one is measured and when the sweep ends; with the most memory one trial
held, the point goes to the pure split search (curve) for the next N, and the curve is stored
as the workload's profile so that the workload's next sweep starts settled. A new search starts from
the best prior there is (splits.priors); from a guess of memory's, its first wave is smaller
(`probe`): its trials show what one holds, which bounds the climb, and the wave is the first
point, whose peak lets placement budget its trials at the next N's slices so that the next N's
trials start beside them (scheduling.placement), rather than once the wave ends.

A workload whose framework sees no GPU on a GPU (a CPU-only build) is not measured: the search
stops for its sweep, saying why. A point that cannot be beside the others (curve.implausible:
each trial faster at a larger N, or more than the cores that do the work allow) is not stored:
it and the points it conflicts with are measured again; after `MAX_REJECTED` such points the
search stops for the sweep, unsettled and saying why. A sweep that ends before its search
settled leaves a profile that says so, which the next sweep of the workload goes on from; a
climb its waiting trials cannot fill measures them all at once, and a sweep too short for the
next N settles on what it measured (splits.tail).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from fractions import Fraction

from sqlalchemy.orm import Session

from gpumux.devices.kinds.base import FirstSplit
from gpumux.splits import curve as split_curve
from gpumux.splits import window as split_window
from gpumux.splits.mix import Mix
from gpumux.splits.tail import climb_short, settle_short
from gpumux.splits.window import Timing
from gpumux.storage import profiles as profile_store
from gpumux.storage import reports as report_store
from gpumux.storage.models import Trial
from gpumux.storage.nodes import ThisNode
from gpumux.throughput import (
    SAMPLES_PER_S,
    SWEEP_ENDED,
    TRIALS_PER_S,
    CurvePoint,
    ThroughputUnit,
)

log = logging.getLogger(__name__)

# Points that could not be, after which a search stops for its sweep: the host disturbs every
# window (other work, a loaded machine), and measuring on would only wander.
MAX_REJECTED = 3


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
    # The largest CUDA context its trials showed on the device (MiB; None: not measured).
    context_mb: int | None = None
    decision: split_curve.Decision = field(
        default_factory=lambda: split_curve.Decision(split=1, settled=False, reason="measuring N=1")
    )
    phase_start: datetime | None = None
    # The N the phase began at (the ceiling lowered since may have changed the N), and since
    # when its device has been short of N (a trial ended, its refill not placed yet).
    phase_split: int | None = None
    dipped_since: datetime | None = None
    filling_since: datetime | None = None
    sweep_id: int | None = None
    # The most memory one trial held while N of them ran in this phase (MiB).
    peak_mb: int | None = None
    # Where the search starts (`split_curve.start`), and the prior that put it there.
    start: int = 1
    origin: str = ""
    # A ceiling memory was seen to impose, lower than the device's: the profile keeps it.
    lowered: int | None = None
    # A first wave smaller than the start, whose trials show what one holds before the start's
    # wave is launched (a guess from memory); its phase is the first point.
    probe: int | None = None
    # That wave's N once it told: until a point is measured, what its trials hold may lower the
    # ceiling further (a framework allocates over its first steps; the first reading is low),
    # and the wave is the N measured.
    probed: int | None = None
    # The start and its origin the device kind guessed before the first wave told what a trial
    # holds (None: it has not told).
    guessed: tuple[int, str] | None = None
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
    # What one trial of the sweep does (samples or steps): the points are read at it.
    work: float | None = None
    # The workload's trials waiting (of any of its auto sweeps) when the last point closed,
    # where all were counted and it had the device to itself (None: not known, or the tail
    # decides since): a climb they cannot fill measures them all at once (`climb_short`).
    waiting: int | None = None
    # The settled decision its profile gave (None: none). While it stands, a save keeps the
    # profile as stored but for the CUDA context measured since: the curve and limits here
    # were read through this daemon's ceiling, and would lose what `gpumux tune` stored.
    resumed: split_curve.Decision | None = None

    @property
    def split(self) -> int:
        return self.decision.split

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
            mix = Mix.alone(running=running, queued=queued, split=self.split)
        # The sweep's trials left here (running and queued) may not fill the N measured next:
        # the search then settles on what it measured, saying so (splits.tail).
        short = mix.counted and settle_short(
            self.curve,
            split=self.split,
            left=running + mix.stale + queued,
            threshold=self.timing.threshold,
            oom_at=self.oom_at,
            ceiling=self.ceiling,
            start=self.start,
            origin=self.origin,
        )
        if short:
            # The tail decides from here: the trials waiting at the last point no longer count.
            self.phase_start = self.filling_since = None
            self.waiting = None
            self.decision = short
            log.info("device %s: %s", self.device_key, self.decision.reason)
            return
        # What a point closed now would count as the trials waiting (`climb_short`).
        waiting = queued if mix.counted else None
        if mix.stale or not mix.full:
            self._filling(now=now, queued=queued, mix=mix)
        else:
            self.filling_since = None
        if running == 0 and mix.shares > 0 and not mix.stale:
            # Only other workloads hold the device: a phase pauses (its rates were taken while
            # the device was full, and its window may close), none begins.
            if self.phase_start is not None:
                self._close(session=session, now=now, waiting=waiting)
            return
        if running == 0 or (mix.stale and not mix.raised) or not mix.full:
            # Trials of the last N still run beside others than the new N's (or of a higher N),
            # or the device has room it could fill (or the sweep's tail leaves it): per-trial
            # rates would not be those of N trials sharing the device. For a moment only (a
            # trial ended, its refill waits for the next probe, as a lower N's trials end
            # through a raised phase), the phase at this N goes on: a tick or two short of N
            # barely moves a rate read over a window.
            if self.phase_start is not None and self.phase_split == self.split and self._dip(now):
                return
            self.phase_start = self.dipped_since = None
            return
        self.dipped_since = None
        alone = mix.raised or mix.shares == Fraction(running, self.split)
        if self.phase_start is None:
            self.phase_start, self.phase_split = now, self.split
            self.peak_mb = max(held, default=None)
            self.mixed = not alone
            return
        self.mixed = self.mixed or not alone
        if held:
            # What has to fit is the most one trial holds: the peak over the phase.
            self.peak_mb = max(self.peak_mb or 0, *held)
        self._close(session=session, now=now, waiting=waiting)

    def _dip(self, now: datetime) -> bool:
        """Whether the phase has been short of N no longer than `Timing.dip`."""
        if self.dipped_since is None:
            self.dipped_since = now
        return now - self.dipped_since <= self.timing.dip

    def _close(self, *, session: Session, now: datetime, waiting: int | None) -> None:
        """Measure the phase's window if it can close now: a point on the curve, the next N;
        `waiting`: the workload's trials queued, where all are counted (a climb they cannot
        fill measures them all at once: `climb_short`)."""
        assert self.phase_start is not None
        window, self.unit = split_window.phase_window(
            session=session,
            device=self.device_key,
            split=self.split,
            phase_start=self.phase_start,
            now=now,
            node_id=self.here.id,
            fingerprint=self.fingerprint,
            auto=self._sweeps,
            unit=self.unit,
            measured=bool(self.curve),
            timing=self.timing,
            # On the CPU a phase is never raised beside a lower N's trials (`raised_beside`):
            # its trials start as the last N's end, their start-ups a large share of short
            # lives, and N of them may never compute at once for half a window.
            alone=not self.mixed and self.cores is None,
        )
        if isinstance(window, split_window.NoGpu):
            self._halt_without_gpu(window.trial)
            return
        if window is None:
            return
        point, self.unit = split_window.measure(
            session=session,
            window=window,
            unit=self.unit,
            split=self.split,
            measured=bool(self.curve),
            peak_mb=self.peak_mb,
        )
        if point is None:
            # Nothing in range was reported: the phase starts again.
            log.warning("device %s: N=%d gave no finite throughput", self.device_key, self.split)
            self.phase_start = None
            return
        # Every point read at the work one trial of the sweep does, start-up included: a
        # trial's life, not the age its window closed at (`CurvePoint.at_work`). A point
        # without a steady reading, measured over trials that each reported once, is their
        # lives already (a stored profile's from before points had them is measured again:
        # `priors.comparable`).
        self.work = self._work(session)
        point = point.at_work(self.work)
        self.curve = [p.at_work(self.work) for p in self.curve]
        self.waiting = None if self.mixed else waiting
        if self.probe is not None:
            # Its trials compute, yet none showed its memory (a device that does not list it):
            # the start's N is all there is to go by; the wave's point stands all the same.
            self.learned(why=f"no trial at N={self.probe} showed what it holds")
        found = None if self.mixed else split_curve.implausible(self.curve, point, cores=self.cores)
        if found is not None:
            self._reject(*found)
            return
        self.ended = False
        self.curve = [p for p in self.curve if p.split != point.split] + [point]
        # Measured, the first wave is a point like any other: the search climbs from its start.
        self.probed = None
        self.decision = self.decide()
        self.phase_start = None
        log.info(
            "device %s: N=%d gives %.4g %s; %s",
            self.device_key,
            point.split,
            point.throughput,
            self.unit,
            self.decision.reason,
        )

    def _work(self, session: Session) -> float | None:
        """What one trial of the sweep does, in the unit's count (`report_store.work_per_trial`);
        what was known before where the sweep says nothing more."""
        if self.sweep_id is None or self.unit == TRIALS_PER_S:
            return self.work
        work = report_store.work_per_trial(
            session=session, sweep_id=self.sweep_id, counted=split_window.counted(self.unit)
        )
        return work if work is not None else self.work

    def _reject(self, why: str, conflicts: Sequence[int]) -> None:
        """A point that cannot be: neither it nor the points it conflicts with are kept; the
        search measures again, or stops for this sweep after `MAX_REJECTED` of them."""
        self.rejected += 1
        self.curve = [p for p in self.curve if p.split not in conflicts]
        self.phase_start = None
        self.decision = self.decide()
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
        """The workload's framework sees no GPU (`split_window.NoGpu`): the search stops for the
        sweep at the N it had; the next sweep of the workload measures again."""
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
        timed = split_window.timed_points(
            session=session,
            curve=self.curve,
            sweep_id=sweep_id,
            device=self.device_key,
            node_id=self.here.id,
        )
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
        # The next sweep goes on from the points as read at all this sweep's trials did.
        self.work = self._work(session)
        self.curve = [p.at_work(self.work) for p in self.curve]
        self.ended = True
        self.waiting = None
        # Why the search stopped, if it did, stays in the profile: a curve without points
        # says nothing by itself.
        why = "" if self.halted is None else f" ({self.halted.removeprefix('unsettled: ')})"
        self.rejected = 0
        self.halted = None
        self.phase_start = self.filling_since = None
        decision = self.decide()
        self.decision = replace(
            decision,
            reason=(
                f"{SWEEP_ENDED} after {len(self.curve)} point(s){why}, the next "
                f"sweep goes on from them; {decision.reason}"
            ),
        )
        return True

    def _filling(self, *, now: datetime, queued: int, mix: Mix) -> None:
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
            # What held the trial back (memory, another workload, a user's running limit) may
            # pass: this sweep stays under it, the profile does not keep it.
            self.lower_ceiling(fits, why=f"only {fits} trial(s) fit at once", keep=False)

    def out_of_memory(self, *, session: Session, split: int) -> None:
        """A trial ran out of memory at N=`split`: that N and above are off the table."""
        self.oom_at = split if self.oom_at is None else min(self.oom_at, split)
        self.probe = None
        self.curve = [p for p in self.curve if p.split < self.oom_at]
        self.decision = self.decide()
        self.phase_start = None
        log.warning(
            "device %s: out of memory at N=%d; %s", self.device_key, split, self.decision.reason
        )
        self.save(session=session)

    def learned(self, *, why: str, start: FirstSplit | None = None) -> None:
        """The first wave told what a trial holds (`why`), or never will: its phase goes on to
        its point, after which the search goes on at its start, within the ceiling memory now
        sets; at `start` instead where that is higher (`known`)."""
        self.probe, self.probed = None, self.probe
        if start is not None:
            self.known(start)
        self.decision = self.decide()
        log.info("device %s: %s; %s", self.device_key, why, self.decision.reason)

    def known(self, start: FirstSplit | None) -> None:
        """What a trial holds is known (again, a larger reading of the first wave): the search
        starts at `start` where that is above the guess it started at, else at the guess; None:
        it is not known after all (the trial took its whole slice, as TensorFlow does)."""
        if self.guessed is None:
            self.guessed = (self.start, self.origin)
        guess, _ = self.guessed
        above = start is not None and start.split > guess
        self.start, self.origin = (start.split, start.why) if start and above else self.guessed
        self.decision = self.decide()

    def save(self, *, session: Session) -> None:
        """Store the curve, the decision and the limits memory set as this workload's profile
        on this device model."""
        if self.resumed is not None and self.decision is self.resumed:
            if self.context_mb is not None:
                profile_store.save_context(
                    session=session,
                    device_name=self.device_name,
                    fingerprint=self.fingerprint,
                    context_mb=self.context_mb,
                )
            return
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
            context_mb=self.context_mb,
        )

    def decide(self) -> split_curve.Decision:
        """The next N (or the settled one) from the curve, within the search's limits."""
        if self.oom_at == 1:
            return split_curve.Decision(
                split=1, settled=True, reason="out of memory even alone: N=1"
            )
        if self.first_wave is not None:
            wave = min(
                self.first_wave,
                split_curve.effective_ceiling(ceiling=self.ceiling, oom_at=self.oom_at),
            )
            why = (
                f"learning what a trial holds at N={wave}"
                if self.probe is not None
                else f"measuring N={wave}, the first wave"
            )
            return split_curve.Decision(
                split=wave,
                settled=False,
                reason=f"{why}; started at N={self.start}: {self.origin}",
            )
        decision = split_curve.next_split(
            self.curve,
            ceiling=self.ceiling,
            threshold=self.timing.threshold,
            oom_at=self.oom_at,
            start=self.start,
            cores=self.cores,
        )
        if self.waiting is not None:
            short = climb_short(
                self.curve,
                decision,
                waiting=self.waiting,
                ceiling=self.ceiling,
                oom_at=self.oom_at,
                start=self.start,
            )
            decision = short or decision
        if self.start == 1:
            return decision
        return replace(
            decision, reason=f"{decision.reason}; started at N={self.start}: {self.origin}"
        )

    @property
    def first_wave(self) -> int | None:
        """The first wave's N while it is the N measured: until its point, unless it ran out of
        memory (None: no first wave, or it was measured)."""
        if self.probe is not None:
            return self.probe
        if self.probed is not None and self.oom_at is None:
            return self.probed
        return None

    def lower_ceiling(self, ceiling: int, *, why: str, keep: bool = True) -> None:
        """No N above `ceiling` will be tried (or kept): memory allows no more; `keep`: the
        profile keeps the ceiling, so that the next sweep of the workload stays under it."""
        self.ceiling = min(self.ceiling, ceiling)
        if keep:
            self.lowered = min(self.ceiling, self.lowered or self.ceiling)
        if self.guessed is not None and self.guessed[0] < self.start > self.ceiling:
            # A start memory allowed, now above what fits: the step below it, as the device
            # kind's `known_split` takes (the guess, where that is no higher), so that the
            # search still descends from it (from a start above the ceiling it would not).
            step = max((n for n in split_curve.SEQUENCE if n < self.ceiling), default=1)
            self.start, self.origin = (
                (step, f"the step below the {self.ceiling} trials that fit")
                if step > self.guessed[0]
                else self.guessed
            )
        self.curve = [p for p in self.curve if p.split <= self.ceiling]
        self.decision = self.decide()
        self.filling_since = None
        log.warning("device %s: %s; %s", self.device_key, why, self.decision.reason)
