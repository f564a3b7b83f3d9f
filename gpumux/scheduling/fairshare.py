"""Fair share: the order in which queued trials of several users get free slots (pure).

Users are compared by the device shares they hold (a trial launched under N holds 1/N of its
device), not by their trials: a trial that holds a whole device counts as much as eight at N=8.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction

DEFAULT_SHARE = 1.0


@dataclass(frozen=True)
class Candidate:
    """A queued trial: whose it is, the priority of its sweep, the device share it would hold."""

    trial_id: int
    owner: str
    sweep_id: int
    priority: int = 0
    share: Fraction = Fraction(1)

    def __post_init__(self) -> None:
        if not 0 < self.share <= 1:
            raise ValueError(f"trial {self.trial_id}: share must be in (0, 1], got {self.share}")


class _OwnerQueue:
    """One owner's candidates: taken by priority then FIFO; the oldest left breaks ties."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, int, Candidate]] = []  # (-priority, position, candidate)
        self.next = 0
        self.positions: list[int] = []  # a heap; positions already taken are skipped lazily
        self.taken: set[int] = set()

    def add(self, position: int, candidate: Candidate) -> None:
        self.entries.append((-candidate.priority, position, candidate))
        self.positions.append(position)

    def sort(self) -> None:
        self.entries.sort(key=lambda entry: entry[:2])
        heapq.heapify(self.positions)

    def empty(self) -> bool:
        return self.next == len(self.entries)

    def oldest(self) -> int:
        while self.positions[0] in self.taken:
            heapq.heappop(self.positions)
        return self.positions[0]

    def peek(self) -> Candidate:
        return self.entries[self.next][2]

    def take(self) -> Candidate:
        _, position, candidate = self.entries[self.next]
        self.next += 1
        self.taken.add(position)
        return candidate


def fair_order(
    candidates: Iterable[Candidate],
    *,
    held: Mapping[str, Fraction],
    running: Mapping[str, int],
    shares: Mapping[str, float] | None = None,
    max_running: int | None = None,
    limit: int | None = None,
) -> list[Candidate]:
    """The order in which the scheduler should offer free slots to queued trials.

    `candidates` come in FIFO order; `held` sums the device shares each owner's running trials
    hold, `running` counts those trials. Each next trial goes to the owner who, given it, would
    hold the least device share (held, already given in this order, and this trial's `share`)
    per unit of fair-share weight, among owners with trials left and under max_running (a count
    of trials); ties go to the owner whose oldest trial has waited longest. An owner's trials
    go highest priority first, then FIFO. At most `limit` trials are returned (None: every one
    that may run).
    """
    shares = shares or {}
    queues: dict[str, _OwnerQueue] = {}
    for position, candidate in enumerate(candidates):
        queues.setdefault(candidate.owner, _OwnerQueue()).add(position, candidate)
    for queue in queues.values():
        queue.sort()
    given = {owner: held.get(owner, Fraction(0)) for owner in queues}
    count = {owner: running.get(owner, 0) for owner in queues}
    for owner in queues:
        share = shares.get(owner, DEFAULT_SHARE)
        if not share > 0:
            raise ValueError(f"shares: the weight of {owner} must be above 0, got {share}")
    # Exact, so that owners even in shares tie and the one who waited longest goes first.
    weight = {owner: Fraction(shares.get(owner, DEFAULT_SHARE)) for owner in queues}
    order: list[Candidate] = []
    while limit is None or len(order) < limit:
        eligible = [
            owner
            for owner, queue in queues.items()
            if not queue.empty() and (max_running is None or count[owner] < max_running)
        ]
        if not eligible:
            break
        # The trial's own share counts before it is given: eight trials at N=8 go before the
        # next one at N=1 (as much device), not one of them and then one that waits for the
        # whole device while the seven others are held back behind it.
        owner = min(
            eligible,
            key=lambda o: ((given[o] + queues[o].peek().share) / weight[o], queues[o].oldest()),
        )
        candidate = queues[owner].take()
        order.append(candidate)
        given[owner] += candidate.share
        count[owner] += 1
    return order
