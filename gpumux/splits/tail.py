"""A sweep's tail: what a split search settles on when the trials its sweep has left cannot
fill the N it would measure next.

On a big GPU a first sweep has a few waves: the N above the last is rarely reachable, nor,
after a few waves, an N below the start. A climb the trials not yet started cannot fill
measures all of them at once instead, where that is above every N measured (`climb_short`);
else, rather than end unsettled, the search measures an N below that the trials left fill (a
step the climb strode over), or settles on what it measured, saying so (`settle_short`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpumux.splits import curve as split_curve
from gpumux.throughput import CurvePoint


def climb_short(
    curve: Sequence[CurvePoint],
    decision: split_curve.Decision,
    *,
    waiting: int,
    ceiling: int,
    oom_at: int | None,
    start: int,
) -> split_curve.Decision | None:
    """Where `decision` climbs above every N measured to an N more than the `waiting` trials
    (the workload's queued when the last point closed) can fill, the decision to measure
    N=`waiting`: once the last N's trials end (a raised phase may begin beside them), the
    waiting ones are all the sweep can run at the new N, the largest N it can still measure.
    None: the climb can be filled, the decision does not climb, no more trials wait than an
    N measured, or fewer than the N the climb starts at (a first wave's point lies below it,
    and the search would not go by a point there). The count is the workload's whole queue,
    which twin devices share: each may get fewer, and the tail then settles (`settle_short`)."""
    measured = max((point.split for point in curve), default=0)
    first = split_curve.first_split(ceiling=ceiling, oom_at=oom_at, start=start)
    if decision.settled or waiting < first or not measured < waiting < decision.split:
        return None
    return replace(
        decision,
        split=waiting,
        reason=f"{waiting} trial(s) of the sweep waiting cannot fill N={decision.split}: "
        f"measuring N={waiting}, all of them at once",
    )


def settle_short(
    curve: Sequence[CurvePoint],
    *,
    split: int,
    left: int,
    threshold: float,
    oom_at: int | None,
    ceiling: int,
    start: int,
    origin: str,
) -> split_curve.Decision | None:
    """The decision where the `left` trials (running and queued) cannot fill `split`, the N
    the search measures next: settled on what was measured, or an N below `split` they fill
    (the step a stride went over; what the climb capped at the largest N measured would
    measure); None: they can fill `split`, or nothing of the climb was measured (a first
    wave's point lies below the N the climb starts at: a cautious guess's half, not a measure
    of the start), or the capped climb would measure an N they cannot fill either."""
    first = split_curve.first_split(ceiling=ceiling, oom_at=oom_at, start=start)
    if left >= split or not any(point.split >= first for point in curve):
        return None
    measured = max(point.split for point in curve)
    decision = split_curve.next_split(
        curve, ceiling=measured, threshold=threshold, oom_at=oom_at, start=start
    )
    cannot = (
        f"{left} trial(s) of the sweep left cannot fill N={split}"
        if left
        else f"no trial of the sweep is left to measure N={split}"
    )
    if split > measured:
        candidates = split_curve.candidate_splits(ceiling=ceiling, oom_at=oom_at, start=start)
        step = min((n for n in candidates if n > measured), default=split)
        if step < split and step <= left:
            # The climb strode over a step the trials left fill.
            return split_curve.Decision(
                split=step, settled=False, reason=f"{cannot}: measuring N={step}"
            )
        # A climb the trials left cannot reach: settled on what was measured, if the walk
        # capped there settles; where it measures below (a step it went over, a descent, a
        # bisection), that N if the trials left fill it; else the search goes on as it decided
        # and its sweep may end unsettled, the next one going on from its curve.
        if not decision.settled:
            if decision.split <= left:
                return replace(decision, reason=f"{cannot}: {decision.reason}")
            return None
        using = f"N={decision.split}, the best of {len(curve)} point(s) measured"
    else:
        # A descent or a bisection below the largest N measured: the smallest N measured
        # that does as well, as the finished search would settle on.
        smallest = split_curve.smallest_within(curve, threshold=threshold)
        using = (
            f"N={smallest}, the smallest of {len(curve)} point(s) measured within "
            f"{threshold:.0%} of the best"
        )
        decision = replace(decision, split=smallest, settled=True)
    if start != 1:
        using = f"{using}; started at N={start}: {origin}"
    return replace(decision, reason=f"{cannot}: using {using}")
