"""Adaptive and pruned sweeps on two node daemons over one PostgreSQL: the budget asked once,
each number once, a node's pruner judging its trial against the other node's, and a restart of
either node losing nothing."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from reliability.conftest import DaemonProcess
from sqlalchemy import select

from gpumux.status import SweepStatus, TrialStatus
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Sweep, Trial, TrialReport

from .conftest import NodeFactory, wait_until
from .test_cluster import node_ids, trials_of

FIXTURES = Path(__file__).parent.parent / "fixtures"
STEPPER = FIXTURES / "stepper.py"
MERGED_STEP = FIXTURES / "merged_step.py"
FIRST_LOSES = FIXTURES / "first_loses.py"


def submit(node: DaemonProcess, folder: Path, script: Path, *params: str, **fields: Any) -> int:
    """A sweep of `script` minimising loss, two trials at a time on a node's CPU; its id."""
    body = {
        "params": list(params),
        "command": [sys.executable, str(script), str(folder)],
        "workdir": str(folder),
        "env": {"PATH": os.environ["PATH"]},
        "objective": "loss:min",
        "split": 2,
        **fields,
    }
    with node.client() as client:
        created = client.post("/sweeps", json=body)
    assert created.status_code == 201, created.text
    sweep_id: int = created.json()["id"]
    return sweep_id


def running_on(db: Sessions, sweep_id: int, node_id: int) -> list[Trial]:
    return [
        t
        for t in trials_of(db, sweep_id)
        if t.node_id == node_id and t.status is TrialStatus.running
    ]


def finished(db: Sessions, sweep_id: int) -> list[Trial] | None:
    """The sweep's trials, by number, once it has finished."""
    with db.read() as session:
        sweep = session.get(Sweep, sweep_id)
        if sweep is None or sweep.status is not SweepStatus.finished:
            return None
    return sorted(trials_of(db, sweep_id), key=lambda t: t.number)


def two_running_on_each(
    db: Sessions, sweep_id: int, ids: dict[str, int], *nodes: DaemonProcess
) -> dict[str, list[Trial]]:
    """Wait until each node runs two of the sweep's trials; those trials by node name."""

    def each() -> dict[str, list[Trial]] | None:
        found = {name: running_on(db, sweep_id, node_id) for name, node_id in ids.items()}
        return found if all(len(on) == 2 for on in found.values()) else None

    return wait_until("two trials running on each node", each, *nodes)


def assert_nothing_lost(trials: list[Trial], budget: int, ids: dict[str, int]) -> None:
    """The whole budget asked once: each number once, each trial run once to its end by one of
    the nodes, its objective recorded, no two asked the same point."""
    assert [t.number for t in trials] == list(range(budget))
    assert {t.status for t in trials} == {TrialStatus.succeeded}
    assert {t.attempt for t in trials} == {1}, [(t.number, t.attempt, t.error) for t in trials]
    assert {t.node_id for t in trials} == set(ids.values())
    for trial in trials:
        assert trial.objective == pytest.approx(trial.params["x"] * 0.9**4)
    assert len({(t.params["x"], t.params["lr"]) for t in trials}) == budget


def test_two_nodes_ask_an_adaptive_sweeps_budget_once_and_each_number_once(
    make_node: NodeFactory, cluster_db: Sessions, tmp_path: Path
) -> None:
    a, b = make_node("a"), make_node("b")
    ids = node_ids(cluster_db)
    (tmp_path / "hold").touch()
    budget = 12
    sweep_id = submit(
        a, tmp_path, STEPPER, "x=1..9", "lr=1e-4..1e-1", search="tpe", trials=budget, seed=5
    )
    # Both nodes ask at once from here: each holds two asked trials, then every slot frees.
    two_running_on_each(cluster_db, sweep_id, ids, a, b)
    (tmp_path / "release-all").touch()
    trials = wait_until("the sweep to finish", lambda: finished(cluster_db, sweep_id), a, b)
    assert_nothing_lost(trials, budget, ids)


def test_a_nodes_pruner_judges_its_trial_against_the_other_nodes_trials(
    make_node: NodeFactory, cluster_db: Sessions, tmp_path: Path
) -> None:
    b = make_node("b")
    # Two fair trials fill node b's two slots; the loser waits for node a.
    sweep_id = submit(b, tmp_path, MERGED_STEP, "x=1,2,20", prune="median:n_startup_trials=2")
    fair_ids = {t.id for t in trials_of(cluster_db, sweep_id) if t.params["x"] < 10}

    def fair_reported() -> bool:
        trials = [t for t in trials_of(cluster_db, sweep_id) if t.id in fair_ids]
        return all(t.status is TrialStatus.running and t.step == 2 for t in trials)

    wait_until("the fair trials to report their steps on node b", fair_reported, b)
    # A trial of node a has one new row to spend, then next to none: a later report of its
    # step merges into that step's row however late it comes (storage/budget.py).
    a = make_node("a", GPUMUX_REPORT_BURST="1", GPUMUX_REPORT_RATE="0.001")
    ids = node_ids(cluster_db)
    [loser] = wait_until(
        "the loser to run on node a", lambda: running_on(cluster_db, sweep_id, ids["a"]), a, b
    )
    (tmp_path / "release-fair").touch()

    def fair_done_and_loser_reported() -> bool:
        trials = trials_of(cluster_db, sweep_id)
        fair = [t for t in trials if t.id in fair_ids]
        return all(t.status is TrialStatus.succeeded for t in fair) and any(
            t.id == loser.id and t.step == 0 for t in trials
        )

    wait_until("the fair trials to end and the loser to report", fair_done_and_loser_reported, a, b)
    # Node a's pruner has judged step 0 at 0.5, under the median (1.0); the rest of the step
    # (9.0) is merged into the same row.
    (tmp_path / "worse").touch()

    def ended(trial_id: int) -> Trial | None:
        trial = next(t for t in trials_of(cluster_db, sweep_id) if t.id == trial_id)
        return trial if trial.status.is_final else None

    pruned = wait_until("node a's pruner to stop the loser", lambda: ended(loser.id), a, b)
    assert pruned.status is TrialStatus.pruned and pruned.node_id == ids["a"]
    assert pruned.error is not None and "pruned at step 0" in pruned.error
    assert {t.node_id for t in trials_of(cluster_db, sweep_id) if t.id in fair_ids} == {ids["b"]}
    with cluster_db.read() as session:
        rows = session.scalars(select(TrialReport).where(TrialReport.trial_id == loser.id)).all()
    # The step was one row, updated in place after the pruner's first look.
    assert [(row.step, row.metrics["loss"]) for row in rows] == [(0, 9.0)]


def test_trials_another_node_asked_and_ended_while_this_one_looked_away_count_for_its_pruner(
    make_node: NodeFactory, cluster_db: Sessions, tmp_path: Path
) -> None:
    a = make_node("a")
    sweep_id = submit(
        a,
        tmp_path,
        FIRST_LOSES,
        "x=1..9",
        search="tpe",
        trials=3,
        split=1,
        prune="median:n_startup_trials=2",
    )
    [loser] = wait_until(
        "the loser to report on node a",
        lambda: [t for t in trials_of(cluster_db, sweep_id) if t.step == 0],
        a,
    )
    # Node a looks away (frozen, its trial running on) while node b asks the rest of the
    # budget and runs it to its end: node a never sees those trials run.
    a.send(signal.SIGSTOP)
    try:
        b = make_node("b")

        def rest_done() -> bool:
            trials = trials_of(cluster_db, sweep_id)
            rest = [t for t in trials if t.id != loser.id]
            return len(rest) == 2 and all(t.status is TrialStatus.succeeded for t in rest)

        wait_until("node b to run the rest of the budget", rest_done, b)
    finally:
        a.send(signal.SIGCONT)

    def ended() -> Trial | None:
        trial = next(t for t in trials_of(cluster_db, sweep_id) if t.id == loser.id)
        return trial if trial.status.is_final else None

    pruned = wait_until("node a's pruner to stop the loser", ended, a, b)
    ids = node_ids(cluster_db)
    assert pruned.status is TrialStatus.pruned and pruned.node_id == ids["a"]
    assert {t.node_id for t in trials_of(cluster_db, sweep_id) if t.id != loser.id} == {ids["b"]}


@pytest.mark.parametrize("restarted", ["a", "b"])
def test_a_node_restarted_mid_sweep_loses_nothing(
    restarted: str, make_node: NodeFactory, cluster_db: Sessions, tmp_path: Path
) -> None:
    nodes = {"a": make_node("a"), "b": make_node("b")}
    ids = node_ids(cluster_db)
    (tmp_path / "hold").touch()
    budget = 8
    sweep_id = submit(
        nodes["a"], tmp_path, STEPPER, "x=1..9", "lr=1e-4..1e-1", search="tpe", trials=budget
    )
    on = two_running_on_each(cluster_db, sweep_id, ids, *nodes.values())
    # One trial of each node ends, and each node asks another in its place.
    for name in on:
        (tmp_path / f"release-{on[name][0].id}").touch()

    def six_asked() -> bool:
        # The new two running, not only asked: a node killed while it starts a trial runs
        # that trial again, a second attempt this test would take for a loss.
        statuses = sorted(t.status for t in trials_of(cluster_db, sweep_id))
        return statuses == sorted([TrialStatus.succeeded] * 2 + [TrialStatus.running] * 4)

    wait_until("two trials to end and two more to run", six_asked, *nodes.values())
    # Killed with its trials running under their supervisors, and started again.
    nodes[restarted].kill9()
    nodes[restarted].start()
    (tmp_path / "release-all").touch()
    trials = wait_until(
        "the sweep to finish", lambda: finished(cluster_db, sweep_id), *nodes.values()
    )
    assert_nothing_lost(trials, budget, ids)
