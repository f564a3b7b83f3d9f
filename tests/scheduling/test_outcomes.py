"""How a trial's end is recorded, given why gpumux stopped it."""

from __future__ import annotations

import signal
from pathlib import Path

from builders import stored_running_trial

from gpumux.config import Settings
from gpumux.processes.rundir import ExitStatus
from gpumux.scheduling import outcomes
from gpumux.scheduling.outcomes import StopReason
from gpumux.status import PruneNote, TrialStatus
from gpumux.storage import lifecycle
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions


def test_a_pruned_trial_ends_with_the_note_kept_when_it_was_stopped(
    sessions: Sessions, settings: Settings, tmp_path: Path
) -> None:
    note = str(PruneNote(step=2, pruner="median", metric="val_loss", value=0.7))
    with sessions.write.begin() as session:
        trial_id = stored_running_trial(session, tmp_path)
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        lifecycle.note_pruned(session=session, trial=trial, note=note)
    # The end comes later, in a transaction of its own, when the signal has landed.
    with sessions.write.begin() as session:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        outcome = outcomes.record_exit(
            session=session,
            trial=trial,
            exit_status=ExitStatus(exit_code=None, signal=signal.SIGTERM),
            stop=StopReason.prune,
            settings=settings,
        )
    assert outcome.status is TrialStatus.pruned
    with sessions.read() as session:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        assert (trial.status, trial.error) == (TrialStatus.pruned, note)
