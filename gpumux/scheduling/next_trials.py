"""The next trials: what each open sweep runs next when slots free.

The scheduler asks every open sweep, in the order sweeps get slots, for at most as many trials
as could start now. A grid or random sweep expanded every trial at submission, so it answers
with its queued trials in their order. An adaptive sweep answers with its queued trials (asked
before a restart, or requeued) and then with trials not asked yet, up to its budget: its sampler
chooses their parameters only once one of them has a slot, so that it learns from every trial
that ended before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.orm import Session

from gpumux.storage import backlog
from gpumux.storage import sweeps as sweep_store
from gpumux.storage import trials as trial_store
from gpumux.storage.models import Sweep, Trial


@dataclass(frozen=True)
class NextTrial:
    """A trial a free slot may go to: a queued one, or one its sweep's sampler will ask for
    once it has the slot (`trial` None; `id` negative, unique in one call)."""

    id: int
    sweep: Sweep
    trial: Trial | None

    @property
    def sweep_id(self) -> int:
        return self.sweep.id

    @property
    def asked(self) -> bool:
        return self.trial is not None


class TrialSource(Protocol):
    """Where a sweep's next trials come from."""

    def next_trials(
        self, *, session: Session, sweep: Sweep, limit: int, placeholder: int
    ) -> list[NextTrial]:
        """At most `limit` trials of `sweep` to start next, in the order to start them; a trial
        not asked yet takes the id `placeholder`, the next one `placeholder - 1`, and so on."""
        ...


class ExpandedTrials:
    """Grid and random sweeps: every trial exists from the start; the next are the queued ones."""

    def next_trials(
        self, *, session: Session, sweep: Sweep, limit: int, placeholder: int
    ) -> list[NextTrial]:
        """The sweep's queued trials in their order."""
        queued = trial_store.queued_trials_of(session=session, sweep=sweep, limit=limit)
        return [NextTrial(trial.id, sweep, trial) for trial in queued]


class AskedTrials(ExpandedTrials):
    """Adaptive sweeps: the queued trials first, then as many not asked yet as the budget has."""

    def next_trials(
        self, *, session: Session, sweep: Sweep, limit: int, placeholder: int
    ) -> list[NextTrial]:
        """Queued trials, then placeholders for trials the sampler asks for at launch."""
        queued = super().next_trials(
            session=session, sweep=sweep, limit=limit, placeholder=placeholder
        )
        left = sweep.trial_count - backlog.asked_count(session=session, sweep=sweep)
        room = max(0, min(limit - len(queued), left))
        return queued + [NextTrial(placeholder - i, sweep, None) for i in range(room)]


EXPANDED = ExpandedTrials()
ASKED = AskedTrials()


def source_of(sweep: Sweep) -> TrialSource:
    """The source of a sweep's trials: expanded at submission, or asked as slots free."""
    return ASKED if sweep.search.adaptive else EXPANDED


def next_trials(*, session: Session, limit: int) -> list[NextTrial]:
    """The trials to offer free slots: at most `limit` of each owner (no more could start in one
    pass), from each open sweep in the order sweeps get slots. Fair share orders them next."""
    chosen: list[NextTrial] = []
    taken: dict[int, int] = {}
    for sweep in sweep_store.open_sweeps(session=session):
        room = limit - taken.get(sweep.owner_id, 0)
        if room <= 0:
            continue
        placeholder = -1 - sum(1 for n in chosen if not n.asked)
        trials = source_of(sweep).next_trials(
            session=session, sweep=sweep, limit=room, placeholder=placeholder
        )
        taken[sweep.owner_id] = taken.get(sweep.owner_id, 0) + len(trials)
        chosen.extend(trials)
    return chosen
