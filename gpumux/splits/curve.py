"""Pure split search: which N (trials at once per device) to run next, and workload fingerprints.

`next_split(curve, ceiling=..., start=s)` is a function of the points measured so far, so the
caller keeps no search state: it measures the N it is told, appends the point and asks again
until `settled`. The start s is the caller's prior (a stored profile, a similar workload's, the
device's guess); s = 1 is the search from scratch.

- Effective ceiling: min(ceiling, oom_at - 1), at least 1; points above it are ignored, and of
  repeated splits the last wins. Candidates: the SEQUENCE values up to the ceiling, plus the
  ceiling and s; after an OOM, those below it, plus the N just below it if the OOM was at a
  candidate. The start is s, or the largest candidate when s is above the effective ceiling,
  or half the N that ran out of memory when that N was s itself (a guess memory proved wrong).
- Ascent: walking the points from the start by increasing N, the first is the leader; a later
  point becomes the leader when it gains at least `threshold` over the leader, otherwise it is a
  miss. Until the knee, measure the next candidate above the largest measured N; where the step
  to that N scaled (each trial did more than 1 - `threshold` of what it did at the N measured
  below it), stride over one candidate to the next, at most `MAX_STRIDE` times the N, not past
  the cores that do the work (the CPU), and not after an out-of-memory trial. The knee is two
  misses in a row, or one at N >= `LARGE` (the median of that many trials' rates is one steady
  reading, and each point there costs a wave of long trials); a point past the knee that gains
  `threshold` over the leader takes the lead all the same.
- Stepped over: once the ascent is over, a candidate the stride went over next to the leader
  is measured before anything else: the one above it (the knee may lie there), and the one below
  it where the step to the leader did not scale (the peak may lie there).
- Refinement up: when the leader's next measured N above (or else the OOM) is a candidate more
  than 1 away, and it measured at least as much as the leader (the peak may lie between) or ran
  out of memory, measure the midpoint. A midpoint that leads, or runs out of memory, is refined
  again towards the same upper bound; one that misses ends the search (a bisection of the gap).
- Descent (start above 1 and not above what memory allows, the ascent settled on the start):
  walking down from the start, a lower N takes the lead when the best measured so far (the start
  or a lower leader) does not gain `threshold` over it, as fewer trials at the same throughput
  are preferred (without a knee, at the ceiling, when it measured at least as much). Compared
  with the best, not with the last N that took the lead, a slow slope of small losses never
  drifts below the threshold of the best: a plateau settles on its smallest N within the
  threshold of the best.
  Until a lower N falls short, measure the candidate just below the lowest measured N; candidates
  between a measured N that is not one (a first wave's, below a start memory allowed) and the
  N above it come first, whether it fell short or took the lead.
- Refinement down: when the N that fell short is a candidate more than 1 below the leader,
  measure the midpoint; one that takes the lead is refined again, one that falls short ends it.
- Settle on the leader: after the ascent, the smallest N that made the last gain of at least
  `threshold` (at the ceiling or an OOM with a single miss, the higher measured of the leader
  and that miss); after a descent, the lowest N that took the lead.
- A point that cannot be beside the others (`implausible`: each trial faster at a larger N, or
  more than the cores that do the work allow) is never stored: the caller measures again.
- At most len(candidates) + 2 ceil(log2(largest candidate gap)) + 1 measurements under a
  ceiling, out-of-memory trials included (`max_measurements`); from N = 1, one bisection only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from gpumux.throughput import CurvePoint

# The steps of the SHARCNET study: Fibonacci numbers grow by about 1.6x, fine at small N where
# the knee usually is, and few steps up to N=34.
SEQUENCE = (1, 2, 3, 5, 8, 13, 21, 34)
DEFAULT_THRESHOLD = 0.05
# Misses in a row that end the ascent: one noisy dip alone does not.
PATIENCE = 2
# From this N a single miss ends the ascent: its point is the median of at least this many
# trials' rates, and waiting for a second miss would cost another wave of the sweep's longest
# trials (on a big GPU, most of a first sweep).
LARGE = 8
# How far a step over a candidate goes at most, in times the N below it: two Fibonacci steps
# (about 2.6x), not the ceiling far above them.
MAX_STRIDE = 3
# How much more one trial may do at N than at a smaller N (per trial) before the point is one
# that cannot be: more trials sharing a device never make each faster. The slack covers noise
# and what overlapping start-ups gain.
SLACK = 1.25

COST_HINTS = (
    "batch",
    "bs",
    "width",
    "units",
    "hidden",
    "layers",
    "depth",
    "channels",
    "filters",
    "size",
    "seq",
    "len",
    "dim",
    "model",
    "arch",
    "image",
    "res",
)


@dataclass(frozen=True)
class Decision:
    """The N to run now, whether the search is over, and why, in one line."""

    split: int
    settled: bool
    reason: str


@dataclass(frozen=True)
class _Walk:
    leader: CurvePoint
    misses: tuple[CurvePoint, ...]
    knee: bool


def effective_ceiling(*, ceiling: int, oom_at: int | None = None) -> int:
    """The largest N the search may try: under the ceiling and under an N that ran out of memory."""
    limit = ceiling if oom_at is None else min(ceiling, oom_at - 1)
    return max(1, limit)


def candidate_splits(*, ceiling: int, oom_at: int | None = None, start: int = 1) -> tuple[int, ...]:
    """The N the search measures, in order (see the module's rules)."""
    ceiling = max(1, ceiling)
    planned = {n for n in SEQUENCE if n <= ceiling} | {ceiling}
    if 1 <= start <= ceiling:
        planned.add(start)
    if oom_at is None or oom_at > ceiling:
        return tuple(sorted(planned))
    # A planned step that ran out of memory is followed by the N just below it, once: while the
    # throughput still rises, the largest N that fits is the likeliest best. An OOM at any other N
    # (that try, or a bisection probe) means memory is tighter than it looked, so the gap below it
    # is bisected rather than stepped down one N per out-of-memory trial.
    below = {n for n in planned if n < oom_at} | {1}
    if oom_at in planned:
        below.add(effective_ceiling(ceiling=ceiling, oom_at=oom_at))
    return tuple(sorted(below))


def first_split(*, ceiling: int, oom_at: int | None = None, start: int = 1) -> int:
    """The N a search from `start` measures first: the start, or the largest N that may fit;
    half the N that ran out of memory where that was the start itself."""
    top = candidate_splits(ceiling=ceiling, oom_at=oom_at, start=start)[-1]
    if oom_at is not None and start >= oom_at:
        # The start was a guess, and memory proved it wrong by a factor nothing tells: the
        # N just below would likely run out too, a wave of start-ups lost. Half of it gives each
        # trial twice the slice, and its trials show what they hold, which bounds the climb.
        return max(1, min(top, oom_at // 2))
    return min(max(1, start), top)


def max_measurements(*, ceiling: int, start: int = 1) -> int:
    """The most measurements a search from `start` under `ceiling` takes, out-of-memory trials
    included."""
    candidates = candidate_splits(ceiling=ceiling, start=start)
    largest_gap = max((b - a for a, b in pairwise(candidates)), default=1)
    # Bisecting a gap g leaves at most ceil(g / 2), so it closes after ceil(log2 g) probes; the
    # extra 1 is the planned step that ran out of memory before the N just below it is tried.
    bisections = (largest_gap - 1).bit_length()
    # From above N = 1 a search may refine both above and below its leader.
    directions = 1 if first_split(ceiling=ceiling, start=start) == 1 else 2
    return len(candidates) + directions * bisections + 1


def next_split(
    curve: Sequence[CurvePoint],
    *,
    ceiling: int,
    threshold: float = DEFAULT_THRESHOLD,
    oom_at: int | None = None,
    start: int = 1,
    cores: int | None = None,
) -> Decision:
    """Decide the N to run next from the points measured so far, searching from `start`;
    `cores`: the cores that do the work, where the device is the host's CPU."""
    if threshold < 0:
        raise ValueError(f"threshold must be at least 0, not {threshold}")
    if oom_at is not None and oom_at <= 1:
        # Nothing smaller to try: whether one trial fits is the trial's problem, not the split's.
        return Decision(split=1, settled=True, reason="out of memory at N=1; using N=1")
    top = effective_ceiling(ceiling=ceiling, oom_at=oom_at)
    candidates = candidate_splits(ceiling=ceiling, oom_at=oom_at, start=start)
    first = first_split(ceiling=ceiling, oom_at=oom_at, start=start)
    by_split = {point.split: point for point in curve if 1 <= point.split <= top}
    points = [by_split[split] for split in sorted(by_split) if split >= first]
    if not points:
        return Decision(split=first, settled=False, reason=f"measuring N={first}")
    walk = _walk(points, threshold=threshold)
    step = _step(
        points, by_split, candidates=candidates, threshold=threshold, oom_at=oom_at, cores=cores
    )
    if not walk.knee and step is not None:
        return Decision(split=step, settled=False, reason=f"measuring N={step}")
    skipped = _skipped(points, walk.leader, candidates=candidates, threshold=threshold)
    if skipped is not None:
        return skipped
    oom = oom_at if oom_at is not None and oom_at <= ceiling else None
    refine = _refine_up(points, walk.leader.split, candidates=candidates, oom_at=oom)
    settled = _settle(walk, top=top, oom_at=oom, threshold=threshold)
    if first == 1 or settled.split != first or first < start:
        # From 1 there is nothing below; and a start memory ruled out (an out-of-memory trial,
        # a ceiling lowered) was a guess: the largest N that fits is the top, and measuring
        # below it would spend trials where memory, not the rate, is the limit.
        return refine or settled
    # The ascent settled on the start: below it first, as a lower leader leaves nothing to
    # refine above the start.
    lower = [by_split[split] for split in sorted(by_split, reverse=True) if split < first]
    descent = _descend(walk, lower, candidates=candidates, threshold=threshold, ascent=settled)
    if descent.settled and descent.split == first and refine is not None:
        return refine
    return descent


def _step(
    points: Sequence[CurvePoint],
    by_split: dict[int, CurvePoint],
    *,
    candidates: Sequence[int],
    threshold: float,
    oom_at: int | None,
    cores: int | None,
) -> int | None:
    """The N the ascent measures next: the candidate above the largest N measured, or the one
    after it where the step to that N scaled (`_scaled`, from the N below it, a first wave's
    too): far below its knee a curve is worth fewer, larger steps. Not past `MAX_STRIDE` times
    that N, nor past the `cores` that do the work (beyond them trials share them: a step that
    scaled below says nothing of those above), nor once a trial ran out of memory (a wave lost
    to each step too far)."""
    last = points[-1]
    above = [n for n in candidates if n > last.split]
    if not above:
        return None
    below = [split for split in by_split if split < last.split]
    if (
        oom_at is None
        and len(above) > 1
        and above[1] <= MAX_STRIDE * last.split
        and (cores is None or above[1] <= cores)
        and below
        and _scaled(by_split[max(below)], last, threshold=threshold)
    ):
        return above[1]
    return above[0]


def _scaled(lower: CurvePoint, higher: CurvePoint, *, threshold: float) -> bool:
    """Whether each trial did at the higher N more than `1 - threshold` of what it did at the
    lower."""
    return higher.throughput / higher.split > (1 - threshold) * lower.throughput / lower.split


def _skipped(
    points: Sequence[CurvePoint], leader: CurvePoint, *, candidates: Sequence[int], threshold: float
) -> Decision | None:
    """A candidate the ascent stepped over next to the leader (`_step`), once the ascent is
    over: the one above it, below the next N measured (the knee may lie there); the one below
    it, where the step to the leader did not scale (the peak may lie there). None: the leader's
    neighbours were measured, or are midpoints of a bisection."""
    if leader.split not in candidates:
        return None
    at = candidates.index(leader.split)
    measured = {point.split for point in points}
    higher = next((point.split for point in points if point.split > leader.split), None)
    above = candidates[at + 1] if at + 1 < len(candidates) else None
    if (
        higher is not None
        and higher in candidates
        and above is not None
        and above < higher
        and above not in measured
    ):
        return Decision(
            split=above,
            settled=False,
            reason=f"measuring N={above} (stepped over between N={leader.split} and N={higher})",
        )
    lower = next((point for point in reversed(points) if point.split < leader.split), None)
    below = candidates[at - 1] if at > 0 else None
    if (
        lower is None
        or lower.split not in candidates
        or below is None
        or below <= lower.split
        or below in measured
        or _scaled(lower, leader, threshold=threshold)
    ):
        return None
    return Decision(
        split=below,
        settled=False,
        reason=f"measuring N={below} (stepped over between N={lower.split} and N={leader.split})",
    )


def _refine_up(
    points: Sequence[CurvePoint], leader: int, *, candidates: Sequence[int], oom_at: int | None
) -> Decision | None:
    """The midpoint between the leader and the N above it that missed or ran out of memory."""
    best = max(point.throughput for point in points if point.split == leader)
    higher = next((point for point in points if point.split > leader), None)
    above = None if higher is None else higher.split
    if above is None and oom_at is not None:
        above = oom_at
    # The ascent measures candidates only, so a measured non-candidate just above the leader is a
    # midpoint that missed: the bisection is over. Towards an OOM it goes on until the gap closes.
    if above is None or above - leader <= 1 or not (above in candidates or above == oom_at):
        return None
    if higher is not None and higher.throughput < best and leader in candidates:
        # A step above measured less: the curve is past its peak, nothing between is worth a
        # wave (a leading midpoint still bisects: the peak may be just above it).
        return None
    split = (leader + above) // 2
    what = "which ran out of memory" if above == oom_at else "measured"
    return Decision(
        split=split,
        settled=False,
        reason=f"measuring N={split} (between N={leader} and N={above}, {what})",
    )


def _walk(points: Sequence[CurvePoint], *, threshold: float) -> _Walk:
    """The leader, its misses up to the knee, and whether there is one. A point past a knee
    that gains over the leader takes the lead all the same (a step the stride went over, filled
    in below points measured above it, may read as the knee)."""
    leader = points[0]
    misses: list[CurvePoint] = []
    knee = False
    for point in points[1:]:
        if point.throughput >= leader.throughput * (1 + threshold):
            leader, misses, knee = point, [], False
        elif not knee:
            misses.append(point)
            knee = len(misses) >= PATIENCE or point.split >= LARGE
    return _Walk(leader=leader, misses=tuple(misses), knee=knee)


def _descend(
    walk: _Walk,
    lower: Sequence[CurvePoint],
    *,
    candidates: Sequence[int],
    threshold: float,
    ascent: Decision,
) -> Decision:
    """Below a start the ascent settled on: the next N down, a midpoint, or the lowest leader."""
    start = leader = best = walk.leader
    # After a knee the curve is flat here, so a lower N within `threshold` does as well. Without
    # one (the ceiling, an OOM) it may still be rising, as the ascent's settling assumes: a lower
    # N must measure at least as much.
    margin = threshold if walk.knee else 0.0
    short = None
    for point in lower:
        if _does_as_well(point, best, margin=margin):
            leader = point
            best = max(best, point, key=lambda p: p.throughput)
        else:
            short = point
            break
    # Steps between a measured N that is not one (a first wave's, below a start memory allowed)
    # and the N above it come first, whether it fell short or did as well: the best may lie
    # there. Else a measured non-candidate just below the leader is a midpoint that fell short.
    measured = {point.split for point in lower}
    upper, bottom = (start, leader) if short is None else (leader, short)
    gap = [n for n in candidates if bottom.split < n < upper.split and n not in measured]
    if gap:
        return Decision(
            split=gap[-1], settled=False, reason=f"measuring N={gap[-1]} (below N={upper.split})"
        )
    if short is None:
        below = max((n for n in candidates if n < leader.split), default=None)
        if below is not None:
            return Decision(
                split=below, settled=False, reason=f"measuring N={below} (below N={leader.split})"
            )
    elif leader.split - short.split > 1 and short.split in candidates:
        split = (short.split + leader.split) // 2
        return Decision(
            split=split,
            settled=False,
            reason=f"measuring N={split} (between N={short.split} and N={leader.split}, measured)",
        )
    shortfall = "" if short is None else f", N={short.split} {_gain(short, leader):+.1%}"
    if leader is start:
        return Decision(
            split=leader.split, settled=True, reason=f"{ascent.reason}; below it{shortfall}"
        )
    reason = (
        f"fewer trials do at least as well: N={start.split} {_gain(start, leader):+.1%} over "
        f"N={leader.split}{shortfall}; using N={leader.split}"
    )
    return Decision(split=leader.split, settled=True, reason=reason)


def smallest_within(curve: Sequence[CurvePoint], *, threshold: float) -> int:
    """The smallest N of a curve (not empty) that does as well as its best: the best gains less
    than `threshold` over it."""
    best = max(curve, key=lambda point: point.throughput)
    return min(
        point.split
        for point in curve
        if point is best or _does_as_well(point, best, margin=threshold)
    )


def _does_as_well(lower: CurvePoint, leader: CurvePoint, *, margin: float) -> bool:
    """Whether a lower N does as well as the leader: the leader gains less than `margin` over it
    (with no margin, it measured at least as much)."""
    if margin == 0:
        return lower.throughput >= leader.throughput
    return leader.throughput < lower.throughput * (1 + margin)


def _settle(walk: _Walk, *, top: int, oom_at: int | None, threshold: float) -> Decision:
    leader = walk.leader
    choice = leader
    if not walk.knee:
        # At the ceiling patience cannot get its second reading, so a single reading would decide
        # alone: with +-10% noise a real 20% gain (a linear curve from N=5 to N=6) reads under 5%
        # about one time in 18. Any gain counts here; ties keep the smaller N.
        choice = max((leader, *walk.misses), key=lambda point: point.throughput)
    using = f"using N={choice.split}"
    if oom_at is not None:
        below = " (best below)" if choice.split < top else ""
        return Decision(
            split=choice.split, settled=True, reason=f"out of memory at N={oom_at}; {using}{below}"
        )
    gains = ", ".join(f"N={miss.split} {_gain(miss, leader):+.1%}" for miss in walk.misses)
    if walk.knee:
        limit = f"{threshold * 100:g}%"
        reason = f"knee: {gains} over N={leader.split} (each < {limit}); {using}"
    elif walk.misses:
        reason = f"the device takes at most N={top}; {using} ({gains} over N={leader.split})"
    else:
        reason = f"the device takes at most N={top}; {using}"
    return Decision(split=choice.split, settled=True, reason=reason)


def _gain(point: CurvePoint, leader: CurvePoint) -> float:
    if leader.throughput <= 0:
        return float("inf")
    return point.throughput / leader.throughput - 1


def implausible(
    curve: Sequence[CurvePoint], point: CurvePoint, *, cores: int | None = None
) -> tuple[str, list[int]] | None:
    """Why `point` cannot be beside the curve's points, and the N it conflicts with; None: it can.

    N trials sharing a device never make each trial faster: the throughput at N is at most
    N / M times that at a smaller M (`SLACK` more). Where the device is the host's `cores` (the
    CPU), trials beyond the cores share them: at most min(N, cores) / min(M, cores) times. Which
    of two such points is wrong cannot be told (a loaded host slows the one, a window of reports
    read together speeds the other), so both are measured again.
    """
    conflicts = []
    why = ""
    for other in curve:
        if other.split == point.split or other.throughput <= 0 or point.throughput <= 0:
            continue
        low, high = sorted((other, point), key=lambda p: p.split)
        ratio = high.split / low.split
        what = f"{high.split / low.split:.3g}x the trials"
        if cores is not None:
            ratio = min(high.split, cores) / min(low.split, cores)
            what = f"{what} on {cores} core{'s' if cores > 1 else ''}"
        if high.throughput > low.throughput * ratio * SLACK:
            conflicts.append(other.split)
            times = high.throughput / low.throughput
            why = (
                f"N={high.split} at {high.throughput:.4g} is {times:.3g}x"
                f" N={low.split} at {low.throughput:.4g} with {what}"
            )
    return (why, conflicts) if conflicts else None


def cost_parameters(names: Iterable[str]) -> list[str]:
    """The parameter names that likely change a trial's cost (batch size, width, depth, ...)."""
    return [name for name in names if any(hint in name.lower() for hint in COST_HINTS)]


def workload_fingerprint(command: Sequence[str], param_tokens: Sequence[str]) -> str:
    """A short hash of the command and its cost parameters' tokens: curves with it are reusable."""
    cost = set(cost_parameters(_token_name(token) for token in param_tokens))
    tokens = sorted(
        (token for token in param_tokens if _token_name(token) in cost),
        key=lambda token: (_token_name(token), token),
    )
    # JSON keeps argv boundaries: ["a b"] and ["a", "b"] must not collide.
    payload = json.dumps({"command": list(command), "params": tokens})
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _token_name(token: str) -> str:
    return token.partition("=")[0]
