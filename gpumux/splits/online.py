"""The online split search: measures one workload on one device while its sweep runs.

Searches (gpumux.splits.searches) keeps one SplitSearch per (device model, workload fingerprint)
for sweeps with `--split auto`. Each tick it reports how many trials run on the device and the
memory each holds; the search waits until exactly N of them have run together for a warm-up and
a window, then measures the device's aggregate throughput over the window from the trials'
reports (samples/s; completed trials/s for scripts that report nothing) and the most memory one
trial held, hands the curve to the pure tuner for the next N, and stores the curve as the
workload's profile so that the next sweep of the workload starts settled.

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

from sqlalchemy.orm import Session

from gpumux.devices.kinds.base import FirstSplit
from gpumux.splits import curve as tuner
from gpumux.storage import profiles as profile_store
from gpumux.storage import reports as report_store
from gpumux.storage.models import Profile, Sweep, Trial
from gpumux.throughput import (
    SAMPLES_PER_S,
    TRIALS_PER_S,
    CurvePoint,
    ThroughputUnit,
    throughput_unit,
)

log = logging.getLogger(__name__)

# Long trials, which rarely end within a window, are measured over this many window lengths.
LONG_WINDOWS = 6

# What TensorFlow, PyTorch, JAX and CUDA print when a process runs out of device memory.
OUT_OF_MEMORY = re.compile(
    r"ResourceExhaustedError|OOM when allocating|CUDA out of memory|out of memory|"
    r"RESOURCE_EXHAUSTED|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation",
)


def is_out_of_memory(log_tail: str) -> bool:
    """Whether a failed trial's last log lines say it ran out of device memory."""
    return OUT_OF_MEMORY.search(log_tail) is not None


@dataclass(frozen=True)
class Timing:
    """How long the search waits: after N changes (warm-up), then measures (window)."""

    warmup: timedelta
    window: timedelta
    threshold: float = tuner.DEFAULT_THRESHOLD


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
    curve: list[CurvePoint] = field(default_factory=list)
    unit: ThroughputUnit = SAMPLES_PER_S
    oom_at: int | None = None
    decision: tuner.Decision = field(
        default_factory=lambda: tuner.Decision(split=1, settled=False, reason="measuring N=1")
    )
    phase_start: datetime | None = None
    ready_at: datetime | None = None
    filling_since: datetime | None = None
    sweep_id: int | None = None
    # The most memory one trial held while N of them ran in this phase (MiB).
    peak_mb: int | None = None
    # Where the search starts (the tuner's `start`), and the prior that put it there.
    start: int = 1
    origin: str = ""
    # A ceiling memory was seen to impose, lower than the device's: the profile keeps it.
    lowered: int | None = None

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
    ) -> SplitSearch:
        """A search for this workload, from the best prior: its stored profile, a similar
        workload's, else `guess` (the device kind's; none: from N=1)."""
        names = [token.partition("=")[0] for token in param_tokens]
        cost = set(tuner.cost_parameters(names))
        search = cls(
            device_key=device_key,
            device_name=device_name,
            fingerprint=tuner.workload_fingerprint(command, param_tokens),
            command=list(command),
            cost_tokens=[t for t in param_tokens if t.partition("=")[0] in cost],
            ceiling=ceiling,
            timing=timing,
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
        top = tuner.effective_ceiling(ceiling=self.ceiling, oom_at=self.oom_at)
        if profile.settled and profile.best_split is not None:
            best = min(profile.best_split, top)
            self.decision = tuner.Decision(
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
    ) -> None:
        """After a tick's placements: trials of the workload running on the device and queued,
        and the memory (MiB) each running one holds, where measured."""
        if self.decision.settled:
            return
        self.sweep_id = sweep_id
        if running != self.split:
            self.phase_start = None
            if running > self.split or queued == 0:
                # Above N: waiting for trials of a larger N to finish. Below N with nothing
                # queued: the sweep's tail, too few trials left to fill N. Neither measures N.
                self.filling_since = None
            elif self.filling_since is None:
                self.filling_since = now
            elif now - self.filling_since > self.timing.warmup + self.timing.window:
                # Work is queued, yet placement found room for fewer than N: memory.
                self._hit_ceiling(session=session, fits=max(1, running))
            return
        self.filling_since = None
        if self.phase_start is None:
            self.phase_start, self.ready_at = now, None
            self.peak_mb = max(held, default=None)
            return
        if held:
            # What has to fit is the most one trial holds: the peak over the phase.
            self.peak_mb = max(self.peak_mb or 0, *held)
        if self.ready_at is None:
            reporting = report_store.trials_reporting(
                session=session, device=self.device_key, since=self.phase_start
            )
            if reporting >= self.split:
                self.ready_at = now
        window = self._window(session=session, now=now)
        if window is None:
            return
        start, ended = window
        point = self._measure(session=session, start=start, end=now, ended=ended)
        if point is None:
            return
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

    def _decide(self) -> tuner.Decision:
        if self.oom_at == 1:
            return tuner.Decision(split=1, settled=True, reason="out of memory even alone: N=1")
        decision = tuner.next_split(
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

    def _window(self, *, session: Session, now: datetime) -> tuple[datetime, list[Trial]] | None:
        """The window to measure now, with the trials that ended in it; None: not yet.

        Short trials spend much of their life starting (TensorFlow's import alone takes
        seconds): their window closes once N of them have ended in it, start-ups averaged in.
        Long trials end rarely: their window opens when N trials have reported, all past
        their start-up, and closes LONG_WINDOWS window lengths later.
        """
        assert self.phase_start is not None
        start = self.phase_start + self.timing.warmup
        if now - start < self.timing.window:
            return None
        ended = report_store.trials_ended(
            session=session, device=self.device_key, start=start, end=now
        )
        if len(ended) >= self.split:
            return start, ended
        if self.ready_at is not None and now - self.ready_at >= LONG_WINDOWS * self.timing.window:
            ready = self.ready_at
            # Sparse reports (one per long epoch): wait until each of the N has reported in it.
            reporting = report_store.trials_reporting(
                session=session, device=self.device_key, since=ready
            )
            if reporting >= self.split:
                return ready, [t for t in ended if t.ended_at is not None and t.ended_at > ready]
        return None

    def _measure(
        self, *, session: Session, start: datetime, end: datetime, ended: list[Trial]
    ) -> CurvePoint | None:
        seconds = (end - start).total_seconds()
        durations = [
            (t.ended_at - t.started_at).total_seconds()
            for t in ended
            if t.started_at is not None and t.ended_at is not None
        ]
        per_trial = statistics.median(durations) if durations else None
        samples = report_store.samples_reported(
            session=session, device=self.device_key, start=start, end=end
        )
        if self.unit == SAMPLES_PER_S and samples == 0 and not self.curve:
            # A script that reports nothing: count finished trials instead, from now on.
            self.unit = TRIALS_PER_S
        if self.unit == SAMPLES_PER_S:
            if samples == 0:
                # Nothing reported yet (long epochs): widen the window.
                return None
            throughput = samples / seconds
        else:
            if per_trial is None:
                return None
            # N slots, each finishing a trial every `per_trial` seconds: counting completions
            # against the window instead would skew with the warm-up cut from its start.
            throughput = self.split / per_trial
        if not math.isfinite(throughput):
            # Reports of absurd sizes (stored before they were bounded) add up to infinity:
            # such a window tells nothing, and an infinite point would poison the curve.
            log.warning("device %s: N=%d gave no finite throughput", self.device_key, self.split)
            self.phase_start = None
            return None
        return CurvePoint(
            split=self.split,
            throughput=throughput,
            seconds_per_trial=per_trial,
            memory_per_trial_mb=self.peak_mb,
        )

    def _hit_ceiling(self, *, session: Session, fits: int) -> None:
        self.lower_ceiling(fits, why=f"only {fits} trial(s) fit at once")

    def lower_ceiling(self, ceiling: int, *, why: str) -> None:
        """No N above `ceiling` will be tried (or kept): memory allows no more."""
        self.ceiling = min(self.ceiling, ceiling)
        self.lowered = self.ceiling if self.lowered is None else min(self.lowered, self.ceiling)
        self.curve = [p for p in self.curve if p.split <= self.ceiling]
        self.decision = self._decide()
        self.filling_since = None
        log.warning("device %s: %s; %s", self.device_key, why, self.decision.reason)


def sweep_fingerprint(sweep: Sweep) -> str:
    """The workload of a sweep: its directory, its command, and the parameters that cost."""
    return tuner.workload_fingerprint([sweep.workdir, *sweep.command], sweep.param_tokens)
