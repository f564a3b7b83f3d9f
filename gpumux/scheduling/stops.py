"""The stops a sweep asks for: its cancel, and its pruner's decisions."""

from __future__ import annotations

from gpumux.scheduling import outcomes
from gpumux.scheduling.outcomes import StopReason
from gpumux.scheduling.watched import Watched
from gpumux.search.studies import Studies
from gpumux.storage import lifecycle
from gpumux.storage import sweeps as sweep_store
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.nodes import ThisNode


class SweepStops:
    """Cancels the queued trials of cancelled sweeps and stops their running ones; stops the
    running trials a sweep's pruner prunes."""

    def __init__(
        self, *, sessions: Sessions, watched: Watched, studies: Studies, here: ThisNode
    ) -> None:
        self.sessions = sessions
        self.watched = watched
        self.studies = studies
        # The node whose trials these are: a pruning is noted only while the trial is its own.
        self.here = here

    def apply_cancels(self) -> None:
        """Drop the queued trials of cancelled sweeps and stop their running ones."""
        with self.sessions.write.begin() as session:
            for sweep in sweep_store.sweeps_to_cancel(session=session):
                lifecycle.cancel_queued_trials(session=session, sweep=sweep)
        for trial_id in self._trials_of_cancelled_sweeps():
            self.watched.stop(trial_id, StopReason.cancel)

    def apply_pruners(self) -> None:
        """Let each pruned sweep's pruner look at the steps its running trials reported, and
        stop those it prunes, like a cancel; their slots go to the next trials once they exit."""
        with self.sessions.read() as session:
            open_sweeps = sweep_store.open_sweeps(session=session)
        self.studies.forget(set(self.studies) - {sweep.id for sweep in open_sweeps})
        if not any(sweep.prune for sweep in open_sweeps):
            return
        with self.sessions.write.begin() as session:
            pruned = [s for s in sweep_store.open_sweeps(session=session) if s.prune is not None]
            stopping = self.studies.to_prune(session=session, sweeps=pruned)
        stopped = []
        for decision in stopping:
            entry = self.watched[decision.trial_id] if decision.trial_id in self.watched else None
            if entry is not None and entry.stop is None:
                self.watched.stop(decision.trial_id, StopReason.prune)
                stopped.append(decision)
        if stopped:
            # Said now, for the trial's end to carry: it reports on until the signal lands.
            with self.sessions.write.begin() as session:
                for decision in stopped:
                    trial = trial_store.get_trial(session=session, trial_id=decision.trial_id)
                    attempt = self.watched[decision.trial_id].process.attempt
                    if trial is not None and outcomes.may_record(
                        trial, attempt=attempt, node_id=self.here.id, what="the pruning"
                    ):
                        lifecycle.note_pruned(session=session, trial=trial, note=decision.note)

    def _trials_of_cancelled_sweeps(self) -> list[int]:
        running = list(self.watched.items())
        sweep_ids = {entry.sweep_id for _, entry in running}
        if not sweep_ids:
            return []
        with self.sessions.read() as session:
            cancelled = {
                sweep_id
                for sweep_id in sweep_ids
                if (sweep := sweep_store.get_sweep(session=session, sweep_id=sweep_id))
                and sweep.cancel_requested
            }
        return [
            trial_id
            for trial_id, entry in running
            if entry.sweep_id in cancelled and entry.stop is None
        ]
