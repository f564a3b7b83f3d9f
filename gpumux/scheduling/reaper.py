"""Reaping: the ends of attempts whose supervisors exited, and the starts of new ones, recorded."""

from __future__ import annotations

from sqlalchemy.orm import Session

from gpumux.config import Settings
from gpumux.processes.rundir import TrialEnd
from gpumux.scheduling import outcomes
from gpumux.scheduling.lines import LogReports
from gpumux.scheduling.outcomes import Outcome
from gpumux.scheduling.reconcile import stop_reason
from gpumux.scheduling.watched import Running, Watched
from gpumux.splits.searches import SplitSearches
from gpumux.storage import lifecycle
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Trial
from gpumux.storage.nodes import ThisNode


class Reaper:
    """Records each watched attempt's end once its supervisor has exited and its log is read to
    its end, and the leader pid of each newly started one; hands what an end teaches to the
    split search."""

    def __init__(
        self,
        *,
        settings: Settings,
        sessions: Sessions,
        watched: Watched,
        lines: LogReports,
        searches: SplitSearches,
        here: ThisNode,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.watched = watched
        self.lines = lines
        self.searches = searches
        # The node whose trials these are: an end or a start is recorded only while its own.
        self.here = here
        # Attempts whose supervisors exited, recorded once their logs are read to the end.
        self.ending: dict[int, tuple[Running, TrialEnd | None]] = {}

    def forget(self) -> None:
        """Let the ends not recorded yet go: a reconcile (or the next daemon) records them, from
        their run directories."""
        self.ending.clear()

    def reap(self) -> None:
        """Record the end of every trial whose supervisor has exited and whose log is read to
        its end, and the leader pid of every trial newly started, in one transaction (each
        commit waits for the disk)."""
        for trial_id, entry, end in self.watched.collect_exited():
            self.ending[trial_id] = (entry, end)
        ended = []
        if self.ending:
            # Their supervisors have exited, so their logs are whole: their last lines are read
            # first, a slice a tick (a flood's end takes several ticks, each short).
            self.lines.ended((t, entry.process.attempt) for t, (entry, _) in self.ending.items())
            for trial_id, attempt in self.lines.collect(only=self.ending):
                # The attempt whose log is whole, not another of the same trial.
                if trial_id in self.ending and self.ending[trial_id][0].process.attempt == attempt:
                    entry, end = self.ending.pop(trial_id)
                    ended.append((trial_id, entry, end))
        leaders = self.watched.new_leaders()
        if not ended and not leaders:
            return
        # A failed commit (a full disk) leaves these trials active in the database and no
        # longer watched: the reconcile picks them up at the next tick, from their run records.
        with self.sessions.write.begin() as session:
            for trial_id, entry, end in ended:
                self._record_end(session, trial_id, entry, end)
            for trial_id, (pid, started) in leaders.items():
                trial = trial_store.get_trial(session=session, trial_id=trial_id)
                attempt = self.watched[trial_id].process.attempt
                if trial is not None and outcomes.may_record(
                    trial, attempt=attempt, node_id=self.here.id, what="its start"
                ):
                    lifecycle.record_started(
                        session=session, trial=trial, pid=pid, pid_started=started
                    )
        for trial_id in leaders:
            self.watched[trial_id].leader_recorded = True

    def _record_end(
        self, session: Session, trial_id: int, entry: Running, end: TrialEnd | None
    ) -> None:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        if trial is None:
            return
        attempt = entry.process.attempt
        if not outcomes.may_record(trial, attempt=attempt, node_id=self.here.id, what="the end"):
            return
        if end is None:
            outcomes.requeue_or_lose(
                session=session,
                trial=trial,
                why="lost its supervisor (killed, or stopped answering)",
                settings=self.settings,
            )
            return
        # The supervisor's own stop (its node's lease lapsed) when this daemon gave none.
        stop = entry.stop or stop_reason(entry.process.run_dir)
        outcome = outcomes.record(
            session=session, trial=trial, end=end, stop=stop, settings=self.settings
        )
        self.pass_on(session, trial, outcome)

    def pass_on(self, session: Session, trial: Trial, outcome: Outcome) -> None:
        """Hand what a trial's end teaches to the split search."""
        if outcome.out_of_memory:
            self.searches.out_of_memory(session=session, trial=trial)
