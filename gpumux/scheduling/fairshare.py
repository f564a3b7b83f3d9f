"""Fair share: the order in which queued trials of several users get free slots (pure)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

DEFAULT_SHARE = 1.0


@dataclass(frozen=True)
class Candidate:
    """A queued trial: whose it is, and the priority of its sweep."""

    trial_id: int
    owner: str
    sweep_id: int
    priority: int = 0


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

    def take(self) -> Candidate:
        _, position, candidate = self.entries[self.next]
        self.next += 1
        self.taken.add(position)
        return candidate


def fair_order(
    candidates: Iterable[Candidate],
    *,
    running: Mapping[str, int],
    shares: Mapping[str, float] | None = None,
    max_running: int | None = None,
    limit: int | None = None,
) -> list[Candidate]:
    """The order in which the scheduler should offer free slots to queued trials.

    `candidates` come in FIFO order, `running` counts the slots each owner holds. Each next
    trial goes to the owner with the fewest slots (held and already given in this order) per
    unit of share, among owners with trials left and under max_running; ties go to the owner
    whose oldest trial has waited longest. An owner's trials go highest priority first, then
    FIFO. At most `limit` trials are returned (None: every one that may run).
    """
    shares = shares or {}
    queues: dict[str, _OwnerQueue] = {}
    for position, candidate in enumerate(candidates):
        queues.setdefault(candidate.owner, _OwnerQueue()).add(position, candidate)
    for queue in queues.values():
        queue.sort()
    held = {owner: running.get(owner, 0) for owner in queues}
    weight = {owner: shares.get(owner, DEFAULT_SHARE) for owner in queues}
    for owner, share in weight.items():
        if not share > 0:
            raise ValueError(f"shares: the weight of {owner} must be above 0, got {share}")
    order: list[Candidate] = []
    while limit is None or len(order) < limit:
        eligible = [
            owner
            for owner, queue in queues.items()
            if not queue.empty() and (max_running is None or held[owner] < max_running)
        ]
        if not eligible:
            break
        owner = min(eligible, key=lambda o: (held[o] / weight[o], queues[o].oldest()))
        order.append(queues[owner].take())
        held[owner] += 1
    return order
