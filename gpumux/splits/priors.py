"""Where a new split search starts: the best prior there is (`resume_search`).

The workload's own profile on the device model (settled: its N; else its curve, from the lowest
N it measured, measured again where its points have no steady reading: `comparable`), else the
newest settled profile of the same command and directory with other cost parameters (its N),
else the device kind's guess, after a smaller first wave that learns what a trial holds where
the guess is memory's (`SplitSearch.probe`). A profile also keeps the N that ran out of memory
and a lowered ceiling, which the next search never climbs into.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from sqlalchemy.orm import Session

from gpumux.devices.kinds.base import FirstSplit
from gpumux.splits import curve as split_curve
from gpumux.splits.online import SplitSearch
from gpumux.splits.window import Timing
from gpumux.storage import profiles as profile_store
from gpumux.storage.models import Profile
from gpumux.storage.nodes import ThisNode
from gpumux.throughput import (
    SAMPLES_PER_S,
    TRIALS_PER_S,
    CurvePoint,
    ThroughputUnit,
    throughput_unit,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prior:
    """What a new search takes from before it: where it starts and why, or the N a settled
    profile chose, and the curve, unit and memory limits of the workload's own profile."""

    ceiling: int
    start: int = 1
    origin: str = ""
    settled: split_curve.Decision | None = None
    curve: list[CurvePoint] = field(default_factory=list)
    unit: ThroughputUnit = SAMPLES_PER_S
    oom_at: int | None = None
    # The CUDA context the workload's trials showed on the device model.
    context_mb: int | None = None
    # A ceiling memory was seen to impose, lower than the device's: the profile keeps it.
    lowered: int | None = None
    # The guess's smaller first wave, which learns what a trial holds (FirstSplit.probe).
    probe: int | None = None


def resume_search(
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
    fingerprint = split_curve.workload_fingerprint(
        command if workdir is None else [workdir, *command], param_tokens
    )
    prior = find_prior(
        session=session,
        device_name=device_name,
        fingerprint=fingerprint,
        workdir=workdir,
        command=list(command),
        ceiling=ceiling,
        guess=guess,
    )
    search = SplitSearch(
        device_key=device_key,
        device_name=device_name,
        fingerprint=fingerprint,
        command=list(command),
        workdir=workdir,
        cost_tokens=[t for t in param_tokens if t.partition("=")[0] in cost],
        ceiling=prior.ceiling,
        timing=timing,
        cores=cores,
        here=here or ThisNode(),
        curve=prior.curve,
        unit=prior.unit,
        oom_at=prior.oom_at,
        context_mb=prior.context_mb,
        start=prior.start,
        origin=prior.origin,
        lowered=prior.lowered,
        probe=prior.probe,
    )
    if prior.settled is not None:
        search.decision = search.resumed = prior.settled
    else:
        search.decision = search.decide()
    log.info("device %s: %s", device_key, search.decision.reason)
    return search


def find_prior(
    *,
    session: Session,
    device_name: str,
    fingerprint: str,
    workdir: str | None,
    command: list[str],
    ceiling: int,
    guess: FirstSplit | None,
) -> Prior:
    """The best prior of a workload on a device model, under the device's `ceiling`; `guess`:
    the device kind's (none: from N=1)."""
    profile = profile_store.get_profile(
        session=session, device_name=device_name, fingerprint=fingerprint
    )
    if profile is not None:
        return _own_profile(profile, device_name=device_name, ceiling=ceiling, guess=guess)
    similar = profile_store.similar_profile(
        session=session,
        device_name=device_name,
        workdir=workdir,
        command=command,
        fingerprint=fingerprint,
    )
    if similar is not None and similar.best_split is not None:
        tokens = " ".join(similar.param_tokens) or "no cost parameters"
        why = f"profile {similar.id} of a similar workload ({tokens})"
        return _start_at(Prior(ceiling=ceiling), similar.best_split, why)
    if guess is not None:
        return _guessed(Prior(ceiling=ceiling), guess)
    return Prior(ceiling=ceiling)


def _own_profile(
    profile: Profile, *, device_name: str, ceiling: int, guess: FirstSplit | None
) -> Prior:
    """Go on from this workload's own profile: its N, else its curve, within its limits."""
    lowered = profile.ceiling
    if lowered is not None:
        ceiling = min(ceiling, lowered)
    unit = throughput_unit(profile.unit)
    stored = [CurvePoint.from_json(point) for point in profile.curve]
    prior = Prior(
        ceiling=ceiling,
        curve=stored if comparable(stored, unit) else [],
        unit=unit,
        oom_at=profile.oom_at,
        context_mb=profile.context_mb,
        lowered=lowered,
    )
    top = split_curve.effective_ceiling(ceiling=ceiling, oom_at=profile.oom_at)
    if profile.settled and profile.best_split is not None:
        best = min(profile.best_split, top)
        reason = f"profile {profile.id} of this workload on {device_name}: N={best}"
        return replace(prior, settled=split_curve.Decision(split=best, settled=True, reason=reason))
    if stored:
        # Unsettled: the ascent goes on from the lowest N it measured (its curve measured again
        # where its points cannot be read at a trial's work).
        lowest = min(point.split for point in stored)
        return _start_at(prior, lowest, f"profile {profile.id} of this workload")
    if guess is not None:
        return _guessed(prior, guess)
    return prior


def comparable(curve: list[CurvePoint], unit: ThroughputUnit) -> bool:
    """Whether a stored curve's points can be read at a trial's work (`CurvePoint.at_work`)
    beside the points a search measures now: each has its steady reading, or the workload is
    counted in finished trials, which have none. A point without one (stored before points had
    them; or measured over trials that each reported once) is a life read at another age."""
    return unit == TRIALS_PER_S or all(point.rate is not None for point in curve)


def _guessed(prior: Prior, guess: FirstSplit) -> Prior:
    """Start at the guess, after its smaller first wave where it has one."""
    started = _start_at(prior, guess.split, guess.why)
    if guess.probe is None or prior.oom_at is not None or not 1 <= guess.probe < started.start:
        # No wave to learn from, or memory already told (the first wave itself ran out of it).
        return started
    return replace(started, probe=guess.probe)


def _start_at(prior: Prior, split: int, origin: str) -> Prior:
    return replace(prior, start=max(1, min(split, prior.ceiling)), origin=origin)
