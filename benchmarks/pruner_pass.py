"""What one pruning pass of a sweep costs the scheduler's tick: `Studies.to_prune` on a sweep
with RUNNING trials each holding ROWS report rows, in-process on a database of its own.

Measured, interleaved, REPEATS times each: an idle pass (nothing new since the last), and a
busy pass (each running trial reported one new step since the last). Prints the medians in
milliseconds. An SQLite file in a temporary directory unless --database-url names an empty
PostgreSQL database. Run it on two checkouts with benchmarks/interleave.sh.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from sqlalchemy import select

from gpumux.schemas.sweeps import SweepCreate
from gpumux.search import planning
from gpumux.search.studies import Studies
from gpumux.status import TrialStatus
from gpumux.storage import lifecycle
from gpumux.storage import owners as owner_store
from gpumux.storage import sweeps as sweep_store
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions, make_engine, make_sessions
from gpumux.storage.migrate import upgrade
from gpumux.storage.models import Sweep, Trial, TrialReport, utcnow


def setup(sessions: Sessions, running: int, rows: int, workdir: str) -> tuple[int, list[int]]:
    """A median-pruned sweep: one finished trial and `running` running ones, every trial with
    `rows` steps reported (each a little better than the median, so none is pruned)."""
    with sessions.write.begin() as session:
        sweep = sweep_store.create_sweep(
            session=session,
            plan=planning.plan_sweep(
                SweepCreate.model_validate(
                    {
                        "params": [f"x=1..{running + 1}"],
                        "command": ["true"],
                        "workdir": workdir,
                        "env": {},
                        "metric": "loss",
                        "mode": "min",
                        "prune": "median:n_startup_trials=1",
                    }
                ),
                max_grid=running + 1,
                seed=1,
            ),
            owner=owner_store.get_or_create_owner(session=session, name="bench"),
        )
        trials = trial_store.list_trials(session=session, sweep_id=sweep.id, limit=running + 1)[0]
        for trial in trials:
            lifecycle.set_trial_status(session=session, trial=trial, status=TrialStatus.starting)
            lifecycle.set_trial_status(session=session, trial=trial, status=TrialStatus.running)
            for step in range(rows):
                session.add(report(trial.id, step, 1.0 if trial is trials[0] else 0.9))
            trial.step, trial.last_report_at = rows - 1, utcnow()
        finished = trials[0]
        finished.objective = 1.0
        lifecycle.set_trial_status(
            session=session, trial=finished, status=TrialStatus.succeeded, ended_at=utcnow()
        )
        return sweep.id, [trial.id for trial in trials[1:]]


def report(trial_id: int, step: int, loss: float) -> TrialReport:
    return TrialReport(trial_id=trial_id, attempt=1, kind="line", step=step, metrics={"loss": loss})


def prune_pass(studies: Studies, sessions: Sessions, sweep_id: int) -> float:
    """One pass, timed as the tick runs it (its own write transaction); seconds."""
    began = time.perf_counter()
    with sessions.write.begin() as session:
        sweep = session.get(Sweep, sweep_id)
        assert sweep is not None
        decided = studies.to_prune(session=session, sweeps=[sweep])
    elapsed = time.perf_counter() - began
    assert decided == [], decided
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--running", type=int, default=32)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        url = args.database_url or f"sqlite:///{Path(folder) / 'gpumux.db'}"
        engine = make_engine(url)
        upgrade(engine)
        sessions = make_sessions(engine)
        sweep_id, running = setup(sessions, args.running, args.rows, folder)
        studies = Studies()
        prune_pass(studies, sessions, sweep_id)
        idle, busy = [], []
        for k in range(args.repeats):
            idle.append(prune_pass(studies, sessions, sweep_id))
            with sessions.write.begin() as session:
                # As each report's transaction does (storage/reports.py): a row, the trial's
                # last step and report time.
                for trial in session.scalars(select(Trial).where(Trial.id.in_(running))):
                    session.add(report(trial.id, args.rows + k, 0.9))
                    trial.step, trial.last_report_at = args.rows + k, utcnow()
            busy.append(prune_pass(studies, sessions, sweep_id))
        engine.dispose()
    print(
        f"{engine.dialect.name} pid {os.getpid()}: {args.running} running trials x {args.rows} "
        f"rows, {args.repeats} passes each: idle median {statistics.median(idle) * 1e3:.2f} ms, "
        f"busy median {statistics.median(busy) * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    main()
