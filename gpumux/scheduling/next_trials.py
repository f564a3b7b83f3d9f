"""The next trials: what each open sweep runs next when slots free.

The scheduler asks every open sweep, in the order sweeps get slots, for at most as many trials
as could start now. A grid or random sweep expanded every trial at submission, so it answers
with its queued trials in their order. A sweep whose trials are chosen as it runs (a sampler
that learns from finished trials) answers by creating them here, one class beside these.
"""

from __future__ import annotations

from typing import Protocol

from sqlalchemy.orm import Session

from gpumux.storage import store
from gpumux.storage.models import Sweep, Trial


class TrialSource(Protocol):
    """Where a sweep's next trials come from."""

    def next_trials(self, *, session: Session, sweep: Sweep, limit: int) -> list[Trial]:
        """At most `limit` queued trials of `sweep` to start next, in the order to start them."""
        ...


class ExpandedTrials:
    """Grid and random sweeps: every trial exists from the start; the next are the queued ones."""

    def next_trials(self, *, session: Session, sweep: Sweep, limit: int) -> list[Trial]:
        """The sweep's queued trials in their order."""
        return store.queued_trials_of(session=session, sweep=sweep, limit=limit)


EXPANDED = ExpandedTrials()


def source_of(sweep: Sweep) -> TrialSource:
    """The source of a sweep's trials: today every sweep is expanded at submission."""
    return EXPANDED


def next_trials(*, session: Session, limit: int) -> list[Trial]:
    """The trials to offer free slots: at most `limit` of each owner (no more could start in one
    pass), from each open sweep in the order sweeps get slots. Fair share orders them next."""
    chosen: list[Trial] = []
    taken: dict[int, int] = {}
    for sweep in store.open_sweeps(session=session):
        room = limit - taken.get(sweep.owner_id, 0)
        if room <= 0:
            continue
        trials = source_of(sweep).next_trials(session=session, sweep=sweep, limit=room)
        taken[sweep.owner_id] = taken.get(sweep.owner_id, 0) + len(trials)
        chosen.extend(trials)
    return chosen
