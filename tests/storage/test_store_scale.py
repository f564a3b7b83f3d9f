"""Listings stay fast with 100,000 trials: every query they run is served by an index.

Timing would be noise on a shared machine; the query plan is what makes them fast, and it is
deterministic. benchmarks/api_load.py measures the latencies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from builders import selects, sweep_plan
from sqlalchemy import insert, text
from sqlalchemy.orm import Session

from gpumux.scheduling.next_trials import next_trials
from gpumux.status import TrialStatus
from gpumux.storage import owners as owner_store
from gpumux.storage import sweeps as sweep_store
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Trial, utcnow

TRIALS = 100_000


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sessions, int]]:
    from gpumux.storage.engine import make_engine, make_sessions
    from gpumux.storage.migrate import upgrade

    path = tmp_path_factory.mktemp("big") / "gpumux.db"
    engine = make_engine(f"sqlite:///{path}")
    upgrade(engine)
    sessions = make_sessions(engine)
    with sessions.write.begin() as session:
        owner = owner_store.get_or_create_owner(session=session, name="alice")
        for _ in range(20):
            sweep_store.create_sweep(
                session=session, plan=sweep_plan(Path("/"), seed=1, trial_params=[{}]), owner=owner
            )
        sweep = sweep_store.create_sweep(
            session=session, plan=sweep_plan(Path("/"), seed=1, trial_params=[]), owner=owner
        )
        now = utcnow()
        statuses = list(TrialStatus)
        session.execute(
            insert(Trial),
            [
                {
                    "sweep_id": sweep.id,
                    "number": n,
                    "params": {"x": n},
                    "status": statuses[n % len(statuses)],
                    "queued_at": now,
                }
                for n in range(TRIALS)
            ],
        )
        sweep.trial_count = TRIALS
        sweep_id = sweep.id
    yield sessions, sweep_id
    engine.dispose()


LISTINGS: dict[str, Callable[[Session, int], Any]] = {
    "a page of a sweep's trials": lambda s, i: trial_store.list_trials(
        session=s, sweep_id=i, offset=50_000, limit=100
    ),
    "a sweep's failed trials": lambda s, i: trial_store.list_trials(
        session=s, sweep_id=i, status=TrialStatus.failed, limit=100
    ),
    "counts by status": lambda s, i: sweep_store.trial_counts(session=s, sweep_ids=[i]),
    "the queue": lambda s, i: next_trials(session=s, limit=64),
    "active trials": lambda s, i: trial_store.active_trials(session=s),
    "a page of sweeps": lambda s, i: sweep_store.list_sweeps(session=s, owner="alice", limit=10),
    "a trial": lambda s, i: trial_store.get_trial(session=s, trial_id=TRIALS // 2),
}


@pytest.mark.parametrize("listing", LISTINGS)
def test_no_listing_scans_the_trials_table(big: tuple[Sessions, int], listing: str) -> None:
    sessions, sweep_id = big
    with sessions.read() as session, selects(sessions) as statements:
        LISTINGS[listing](session, sweep_id)
    assert statements
    with sessions.read() as session:
        for statement, parameters in statements:
            plan = [
                row[-1]
                for row in session.connection().exec_driver_sql(
                    f"EXPLAIN QUERY PLAN {statement}", parameters
                )
            ]
            assert not any(step.startswith("SCAN") for step in plan), plan


def test_the_big_database_holds_what_the_listings_page_through(big: tuple[Sessions, int]) -> None:
    sessions, sweep_id = big
    with sessions.read() as session:
        page, count = trial_store.list_trials(
            session=session, sweep_id=sweep_id, offset=50_000, limit=3
        )
        assert count == TRIALS and [t.number for t in page] == [50_000, 50_001, 50_002]
        assert session.execute(text("SELECT count(*) FROM trials")).scalar() == TRIALS + 20
