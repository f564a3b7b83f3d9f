"""Node membership on both backends: join, restart, a name taken, leases, expiry, leave."""

from __future__ import annotations

import time
from datetime import timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from builders import stored_sweep
from sqlalchemy import select, update

from gpumux.config import Settings
from gpumux.home.layout import Layout
from gpumux.splits.searches import ActiveTrials
from gpumux.status import NodeState, TrialStatus
from gpumux.storage import lifecycle, membership
from gpumux.storage import reports as report_store
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Node, Trial, token_hash
from gpumux.storage.nodes import NodeIdentity

LEASE_S = 30.0


def join(
    db: Sessions,
    name: str = "gpu1",
    home: str = "home-a",
    *,
    pid: int = 123,
    devices: list[dict[str, Any]] | None = None,
) -> NodeIdentity:
    """Join as `name` from the data directory `home` (a 30 s lease, two lost retries)."""
    with db.write.begin() as session:
        return membership.join(
            session=session,
            name=name,
            home=home,
            url=None,
            pid=pid,
            lease_s=LEASE_S,
            lost_retries=2,
            devices=devices or [],
        )


def lapse(db: Sessions, node: NodeIdentity) -> None:
    """Put the node's lease a minute in the past, as if it had stopped renewing it."""
    with db.write.begin() as session:
        now = membership.database_now(session)
        session.execute(
            update(Node).where(Node.id == node.id).values(lease_until=now - timedelta(minutes=1))
        )


def claimed_trials(db: Sessions, tmp_path: Path, node: NodeIdentity, n: int) -> list[int]:
    """A sweep of n trials, each claimed by `node` and running."""
    with db.write.begin() as session:
        sweep = stored_sweep(session, tmp_path, n)
        ids = []
        for trial in trial_store.list_trials(session=session, sweep_id=sweep.id)[0]:
            claimed = trial_store.claim_trial(session=session, trial_id=trial.id, node=node)
            assert claimed is not None
            lifecycle.set_trial_status(
                session=session, trial=claimed, status=TrialStatus.starting, node_id=node.id
            )
            lifecycle.set_trial_status(session=session, trial=claimed, status=TrialStatus.running)
            ids.append(trial.id)
    return ids


def row(db: Sessions, node: NodeIdentity) -> Node:
    with db.read() as session:
        found = session.get(Node, node.id)
        assert found is not None
        return found


def test_join_registers_the_node_with_a_hashed_secret_and_a_lease(db: Sessions) -> None:
    node = join(db, devices=[{"key": "cpu", "kind": "cpu", "name": "CPU", "memory_mb": 1}])
    stored = row(db, node)
    assert (node.name, node.incarnation, stored.state) == ("gpu1", 1, NodeState.active)
    assert stored.token_hash == token_hash(node.secret) != node.secret
    assert stored.devices == [{"key": "cpu", "kind": "cpu", "name": "CPU", "memory_mb": 1}]
    assert stored.lease_until - stored.heartbeat_at == timedelta(seconds=LEASE_S)


def test_a_restart_takes_its_own_row_back_as_the_next_incarnation(db: Sessions) -> None:
    first = join(db)
    again = join(db, pid=456)
    assert (again.id, again.incarnation) == (first.id, 2)
    assert again.secret != first.secret
    assert row(db, again).pid == 456


def test_a_live_name_of_another_home_is_refused_with_what_to_do(db: Sessions) -> None:
    first = join(db)
    with pytest.raises(membership.NodeNameTaken, match="GPUMUX_NODE_NAME") as refused:
        join(db, home="home-b")
    assert "'gpu1'" in str(refused.value) and "\n" not in str(refused.value)
    assert row(db, first).home_id == "home-a"
    assert join(db, name="gpu2", home="home-b").id != first.id


def test_a_lapsed_name_is_taken_over_and_its_trials_requeued(db: Sessions, tmp_path: Path) -> None:
    first = join(db)
    trial_ids = claimed_trials(db, tmp_path, first, 2)
    lapse(db, first)
    taken = join(db, home="home-b")
    assert (taken.id, taken.incarnation) == (first.id, 2)
    with db.read() as session:
        trials = [trial_store.get_trial(session=session, trial_id=i) for i in trial_ids]
        assert {(t.status, t.attempt, t.node_id) for t in trials if t} == {
            (TrialStatus.queued, 2, None)
        }


def test_heartbeat_renews_only_the_live_incarnation(db: Sessions) -> None:
    first = join(db)
    before = row(db, first).lease_until
    # The database clock moves on (milliseconds on SQLite): a renewal is seen as later.
    deadline = time.monotonic() + 5
    while True:
        with db.write.begin() as session:
            assert membership.heartbeat(session=session, node=first, lease_s=LEASE_S)
        if row(db, first).lease_until > before or time.monotonic() > deadline:
            break
    assert row(db, first).lease_until > before
    second = join(db)
    with db.write.begin() as session:
        assert not membership.heartbeat(session=session, node=first, lease_s=LEASE_S)
        assert membership.heartbeat(session=session, node=second, lease_s=LEASE_S)


def test_expiry_requeues_within_the_budget_then_loses(db: Sessions, tmp_path: Path) -> None:
    a = join(db, name="a", home="home-a")
    b = join(db, name="b", home="home-b")
    fresh, spent = claimed_trials(db, tmp_path, a, 2)
    with db.write.begin() as session:
        session.execute(update(Trial).where(Trial.id == spent).values(attempt=3))
    lapse(db, a)
    with db.write.begin() as session:
        assert membership.expire(session=session, lost_retries=2) == ["a"]
        assert membership.expire(session=session, lost_retries=2) == []
    with db.read() as session:
        requeued = trial_store.get_trial(session=session, trial_id=fresh)
        lost = trial_store.get_trial(session=session, trial_id=spent)
        assert requeued is not None and lost is not None
        assert (requeued.status, requeued.attempt, requeued.node_id) == (
            TrialStatus.queued,
            2,
            None,
        )
        assert "whose lease lapsed" in (requeued.error or "")
        assert (lost.status, lost.attempt) == (TrialStatus.lost, 3)
    assert row(db, a).state is NodeState.lost
    assert row(db, b).state is NodeState.active
    with db.write.begin() as session:
        # The lost incarnation neither renews nor claims.
        assert not membership.heartbeat(session=session, node=a, lease_s=LEASE_S)
        assert trial_store.claim_trial(session=session, trial_id=fresh, node=a) is None
        assert trial_store.claim_trial(session=session, trial_id=fresh, node=b) is not None


def test_expiry_spares_a_node_that_renewed(db: Sessions, tmp_path: Path) -> None:
    a = join(db, name="a", home="home-a")
    claimed_trials(db, tmp_path, a, 1)
    lapse(db, a)
    with db.write.begin() as session:
        assert membership.heartbeat(session=session, node=a, lease_s=LEASE_S)
        assert membership.expire(session=session, lost_retries=2) == []
    assert row(db, a).state is NodeState.active


def test_a_node_whose_lease_ran_out_claims_nothing_until_it_renews(
    db: Sessions, tmp_path: Path
) -> None:
    a = join(db, name="a", home="home-a")
    with db.write.begin() as session:
        sweep = stored_sweep(session, tmp_path, 1)
        (trial_id,) = (t.id for t in trial_store.list_trials(session=session, sweep_id=sweep.id)[0])
    lapse(db, a)
    with db.write.begin() as session:
        assert trial_store.claim_trial(session=session, trial_id=trial_id, node=a) is None
    # Still active, no node having expired it yet, but any node's next heartbeat may.
    assert row(db, a).state is NodeState.active
    with db.write.begin() as session:
        assert membership.heartbeat(session=session, node=a, lease_s=LEASE_S)
    with db.write.begin() as session:
        claimed = trial_store.claim_trial(session=session, trial_id=trial_id, node=a)
        assert claimed is not None and claimed.id == trial_id


def test_leave_waits_for_the_active_trials(db: Sessions, tmp_path: Path) -> None:
    a = join(db)
    (trial_id,) = claimed_trials(db, tmp_path, a, 1)
    with db.write.begin() as session:
        assert not membership.leave(session=session, node=a)
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        lifecycle.set_trial_status(session=session, trial=trial, status=TrialStatus.succeeded)
        assert membership.leave(session=session, node=a)
    assert row(db, a).state is NodeState.left
    # A node that left is taken over by another home at once.
    assert join(db, home="home-b").incarnation == 2


def test_home_id_is_made_once(tmp_path: Path) -> None:
    made = membership.home_id(tmp_path)
    assert membership.home_id(tmp_path) == made
    assert Layout(tmp_path).node_id.stat().st_mode & 0o777 == 0o600


def test_the_lease_must_outlast_two_heartbeats(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="GPUMUX_NODE_LEASE"):
        Settings(home=tmp_path, node_heartbeat=5, node_lease=10)
    assert Settings(home=tmp_path, node_heartbeat=1, node_lease=3).node_lease == 3


def test_the_split_search_sees_only_its_own_node_s_trials_on_a_device_key(
    db: Sessions, tmp_path: Path
) -> None:
    # Every node calls its CPU "cpu": another node's trials there run on another machine.
    here, there = join(db, "gpu1", "home-a"), join(db, "gpu2", "home-b")
    mine = claimed_trials(db, tmp_path / "a", here, 2)
    claimed_trials(db, tmp_path / "b", there, 3)
    with db.write.begin() as session:
        started = membership.database_now(session)
        for trial in session.scalars(select(Trial)):
            trial.device, trial.split, trial.started_at = "cpu", 4, started
    with db.read() as session:
        on = ActiveTrials.now(session=session, node_id=here.id)
        everywhere = ActiveTrials.now(session=session)
        since = membership.database_now(session) - timedelta(hours=1)
        at_split = report_store.trials_at_split(
            session=session, device="cpu", split=4, since=since, node_id=here.id
        )
    assert on.shares["cpu"] == Fraction(2, 4) and everywhere.shares["cpu"] == Fraction(5, 4)
    assert [t.id for t in at_split] == mine


def trial_rows(db: Sessions, trial_ids: list[int]) -> list[tuple[TrialStatus, int, int | None]]:
    with db.read() as session:
        trials = [trial_store.get_trial(session=session, trial_id=i) for i in trial_ids]
        return [(t.status, t.attempt, t.node_id) for t in trials if t is not None]


def test_a_renamed_restart_takes_its_row_and_keeps_its_trials(db: Sessions, tmp_path: Path) -> None:
    # A graceful stop left the trial running; the daemon comes back from the same data directory
    # under another hostname: its trial is its own still, not another node's to requeue.
    first = join(db, "old-host")
    trial_ids = claimed_trials(db, tmp_path, first, 1)
    again = join(db, "new-host")
    with db.read() as session:
        rows = list(session.scalars(select(Node)))
    assert [(r.id, r.name, r.incarnation, r.state) for r in rows] == [
        (first.id, "new-host", 2, NodeState.active)
    ]
    assert (again.id, again.name, again.incarnation) == (first.id, "new-host", 2)
    assert trial_rows(db, trial_ids) == [(TrialStatus.running, 1, first.id)]
    with db.write.begin() as session:
        # The old incarnation no longer renews the row; the renamed one does.
        assert not membership.heartbeat(session=session, node=first, lease_s=LEASE_S)
        assert membership.heartbeat(session=session, node=again, lease_s=LEASE_S)


def test_a_rename_to_a_live_node_s_name_is_refused(db: Sessions, tmp_path: Path) -> None:
    first = join(db, "a", "home-a")
    trial_ids = claimed_trials(db, tmp_path, first, 1)
    join(db, "b", "home-b")
    with pytest.raises(membership.NodeNameTaken, match="GPUMUX_NODE_NAME"):
        join(db, "b", "home-a")
    assert (row(db, first).name, row(db, first).incarnation) == ("a", 1)
    assert trial_rows(db, trial_ids) == [(TrialStatus.running, 1, first.id)]


def test_a_rename_to_a_lapsed_name_takes_that_row_with_its_own_trials(
    db: Sessions, tmp_path: Path
) -> None:
    mine = join(db, "a", "home-a")
    my_trials = claimed_trials(db, tmp_path / "a", mine, 1)
    theirs = join(db, "b", "home-b")
    their_trials = claimed_trials(db, tmp_path / "b", theirs, 1)
    lapse(db, theirs)
    taken = join(db, "b", "home-a")
    assert (taken.id, taken.incarnation) == (theirs.id, 2)
    assert row(db, taken).home_id == "home-a" and row(db, mine).state is NodeState.left
    assert trial_rows(db, my_trials) == [(TrialStatus.running, 1, theirs.id)]
    assert trial_rows(db, their_trials) == [(TrialStatus.queued, 2, None)]
    # The data directory has one active row: a restart under either name finds its trials.
    back = join(db, "a", "home-a")
    assert (back.id, row(db, taken).state) == (mine.id, NodeState.left)
    assert trial_rows(db, my_trials) == [(TrialStatus.running, 1, mine.id)]
