"""Several node daemons on one PostgreSQL: they pack one queue, and a node that dies has its
trials finished elsewhere, once."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from reliability.conftest import DaemonProcess
from sqlalchemy import select

from gpumux.home.layout import Layout
from gpumux.processes import rundir
from gpumux.status import NodeState, TrialStatus
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Node, Trial

from .conftest import NodeFactory, wait_until

RELEASE_THEN_EXIT = Path(__file__).parent.parent / "fixtures" / "release_then_exit.py"
LEASE_S, HEARTBEAT_S = 3, 1
SHORT_LEASE = {"GPUMUX_NODE_LEASE": str(LEASE_S), "GPUMUX_NODE_HEARTBEAT": str(HEARTBEAT_S)}


def submit(node: DaemonProcess, folder: Path, params: list[str], command: list[str]) -> int:
    """A sweep of `command` over `params`, two trials at a time on a node's CPU; its id."""
    body = {
        "params": params,
        "command": command,
        "workdir": str(folder),
        "env": {"PATH": os.environ["PATH"]},
        "split": 2,
    }
    with node.client() as client:
        created = client.post("/sweeps", json=body)
    assert created.status_code == 201, created.text
    sweep_id: int = created.json()["id"]
    return sweep_id


def trials_of(db: Sessions, sweep_id: int) -> list[Trial]:
    with db.read() as session:
        return list(session.scalars(select(Trial).where(Trial.sweep_id == sweep_id)))


def node_ids(db: Sessions) -> dict[str, int]:
    with db.read() as session:
        return {node.name: node.id for node in session.scalars(select(Node))}


def two_nodes_two_trials_each(
    make_node: NodeFactory, db: Sessions, folder: Path
) -> tuple[DaemonProcess, DaemonProcess, dict[str, int], int, list[Trial]]:
    """Nodes a and b on short leases, and a sweep of four trials that wait to be released
    (x=0: each exits 0 once released; y tells them apart), two running on each node."""
    a, b = make_node("a", **SHORT_LEASE), make_node("b", **SHORT_LEASE)
    ids = node_ids(db)
    command = [sys.executable, str(RELEASE_THEN_EXIT), str(folder)]
    sweep_id = submit(a, folder, ["x=0", "y=1..4"], command)
    trials = wait_until(
        "two trials running on each node", lambda: two_running_on_each(db, sweep_id, ids), a, b
    )
    return a, b, ids, sweep_id, trials


def two_running_on_each(db: Sessions, sweep_id: int, ids: dict[str, int]) -> list[Trial] | None:
    """The sweep's trials once two run on node a and two on node b."""
    trials = trials_of(db, sweep_id)
    on = Counter(t.node_id for t in trials if t.status is TrialStatus.running)
    return trials if on == {ids["a"]: 2, ids["b"]: 2} else None


def all_ended(db: Sessions, sweep_id: int) -> list[Trial] | None:
    trials = trials_of(db, sweep_id)
    return trials if all(t.status.is_final for t in trials) else None


@pytest.mark.parametrize("count", [2, 3])
def test_nodes_pack_one_sweep_and_claim_each_trial_once(
    count: int, make_node: NodeFactory, cluster_db: Sessions, tmp_path: Path
) -> None:
    nodes = [make_node(f"node{i}") for i in range(1, count + 1)]
    command = [sys.executable, "-c", "import time; time.sleep(0.5)"]
    sweep_id = submit(nodes[0], tmp_path, [f"n=1..{6 * count}"], command)
    trials = wait_until("every trial to end", lambda: all_ended(cluster_db, sweep_id), *nodes)
    assert {t.status for t in trials} == {TrialStatus.succeeded}
    # One started attempt each: never requeued, one run directory across every node's home.
    assert {t.attempt for t in trials} == {1}
    run_dirs = sorted(p.name for node in nodes for p in (node.home / "runs").iterdir())
    assert run_dirs == sorted(f"{t.id}.1" for t in trials)
    # Every node ran trials of the one queue.
    assert {t.node_id for t in trials} == set(node_ids(cluster_db).values())


def test_a_killed_node_has_its_trials_finished_elsewhere_once(
    make_node: NodeFactory, cluster_db: Sessions, tmp_path: Path
) -> None:
    a, b, ids, sweep_id, trials = two_nodes_two_trials_each(make_node, cluster_db, tmp_path)
    on_a = {t.id for t in trials if t.node_id == ids["a"]}
    # A power cut: the daemon and everything it started die at once.
    a.kill9()
    a.kill_spawned()

    def a_expired() -> bool:
        with cluster_db.read() as session:
            node = session.get(Node, ids["a"])
            return node is not None and node.state is NodeState.lost

    wait_until("node a to be marked lost", a_expired, b)
    (tmp_path / "release-0").touch()
    ended = wait_until("every trial to end", lambda: all_ended(cluster_db, sweep_id), b)
    assert {t.status for t in ended} == {TrialStatus.succeeded}
    for trial in ended:
        assert trial.node_id == ids["b"]
        assert trial.attempt == (2 if trial.id in on_a else 1)
    # Each of a's trials ran once more, on b: 4 first attempts and 2 second ones.
    runs = (tmp_path / "started-0").read_text().split()
    assert sorted(runs[0::2]) == ["1", "1", "1", "1", "2", "2"]


def test_a_killed_daemon_s_supervisors_stop_its_trials_before_another_node_requeues_them(
    make_node: NodeFactory, cluster_db: Sessions, tmp_path: Path
) -> None:
    # The daemon alone dies: its supervisors outlive it, and must not run on beside the
    # attempts another node starts once the lease lapsed.
    a, b, ids, sweep_id, trials = two_nodes_two_trials_each(make_node, cluster_db, tmp_path)
    on_a = {t.id: t.pid for t in trials if t.node_id == ids["a"]}
    a.kill9()

    def requeued() -> bool:
        now = [t for t in trials_of(cluster_db, sweep_id) if t.id in on_a]
        return all(t.attempt == 2 for t in now)

    wait_until("b to requeue a's trials", requeued, b)
    # The first attempts were gone before any node could run them again: stopped by their
    # supervisors when the lease lapsed, a heartbeat before b could requeue them.
    assert not any(alive(pid) for pid in on_a.values()), "ran beside its next attempt"
    for trial_id in on_a:
        old = a.home / "runs" / f"{trial_id}.1"
        ended = json.loads((old / "exit.json").read_text())
        assert ended["signal"] == signal.SIGKILL and (old / "stop").read_text() == "lease"
    (tmp_path / "release-0").touch()
    ended_trials = wait_until("every trial to end", lambda: all_ended(cluster_db, sweep_id), b)
    assert {t.status for t in ended_trials} == {TrialStatus.succeeded}
    assert {t.id: t.attempt for t in ended_trials if t.id in on_a} == dict.fromkeys(on_a, 2)


def test_a_node_frozen_past_its_lease_kills_its_stale_trials_and_rejoins(
    make_node: NodeFactory, cluster_db: Sessions, tmp_path: Path
) -> None:
    a, b, ids, sweep_id, trials = two_nodes_two_trials_each(make_node, cluster_db, tmp_path)
    stale = {t.id: t.pid for t in trials if t.node_id == ids["a"]}
    a.send(signal.SIGSTOP)
    try:

        def requeued() -> bool:
            now = {t.id: t for t in trials_of(cluster_db, sweep_id)}
            return all(now[i].attempt == 2 for i in stale)

        wait_until("a's trials to be requeued", requeued, b)
        # A late report of an old attempt, with its own token, is refused on any node.
        trial_id = min(stale)
        token = (tmp_path / f"token-{trial_id}.1").read_text()
        with httpx.Client(base_url=b.url, timeout=30) as client:
            late = client.post(
                "/reports",
                headers={"Authorization": f"Bearer {token}"},
                json={"trial_id": trial_id, "attempt": 1, "kind": "manual", "step": 9},
            )
        assert late.status_code in (403, 409), late.text
    finally:
        a.send(signal.SIGCONT)
    wait_until("a to kill its stale trials", lambda: not any(map(alive, stale.values())), a)
    wait_until("a to join again", lambda: rejoined(cluster_db, ids["a"]), a)
    assert "lease of incarnation 1 lost" in a.log_tail(200)
    (tmp_path / "release-0").touch()
    ended = wait_until("every trial to end", lambda: all_ended(cluster_db, sweep_id), a, b)
    assert {t.status for t in ended} == {TrialStatus.succeeded}
    assert {t.id: t.attempt for t in ended if t.id in stale} == dict.fromkeys(stale, 2)


def test_a_node_whose_renewal_waited_past_its_lease_file_launches_nothing_until_it_is_renewed(
    make_node: NodeFactory, cluster_db: Sessions, tmp_path: Path
) -> None:
    # Another node frozen inside a write transaction holds the write lock until the server ends
    # its session: b's renewal waits, and lands with a database lease that holds and a lease
    # file (counted from before the wait) that has lapsed. Its supervisors refuse to start
    # anything then: a claim made meanwhile would burn the trial's attempts to `lost`.
    b = make_node("b", **SHORT_LEASE)
    lease_file = Layout(b.home).node_lease
    command = [sys.executable, str(RELEASE_THEN_EXIT), str(tmp_path)]
    with ThreadPoolExecutor(max_workers=1) as pool:
        with cluster_db.write.begin() as session:
            session.execute(select(1))  # the write lock, taken at the first statement
            # Queued while the lock is held: claimable once b's waiting writes go through.
            submitted = pool.submit(submit, b, tmp_path, ["x=0", "y=1,2"], command)
            # b's waiting renewal began before its lease file lapsed, so the file it writes
            # once the lock is let go lapses at most a lease less a heartbeat after that: held
            # past it, the renewal lands lapsed (the file read again: one renewal may land
            # between our read and our lock).
            wait_until(
                "b's renewal to wait past its lease file",
                lambda: rundir.boottime() > rundir.lease_until(lease_file) + LEASE_S - HEARTBEAT_S,
                b,
            )
        sweep_id = submitted.result()
    trials = wait_until(
        "both trials running", lambda: all_running(cluster_db, sweep_id, count=2), b
    )
    assert {t.attempt for t in trials} == {1}, [t.error for t in trials]
    (tmp_path / "release-0").touch()
    ended = wait_until("every trial to end", lambda: all_ended(cluster_db, sweep_id), b)
    assert {(t.status, t.attempt) for t in ended} == {(TrialStatus.succeeded, 1)}


def all_running(db: Sessions, sweep_id: int, *, count: int) -> list[Trial] | None:
    trials = trials_of(db, sweep_id)
    running = [t for t in trials if t.status is TrialStatus.running]
    ended = [t for t in trials if t.status.is_final]
    assert not ended, [(t.id, t.status, t.attempt, t.error) for t in ended]
    return trials if len(running) == count else None


def rejoined(db: Sessions, node_id: int) -> bool:
    with db.read() as session:
        node = session.get(Node, node_id)
        return node is not None and node.incarnation == 2 and node.state is NodeState.active


def alive(pid: int | None) -> bool:
    """Whether the process runs (a zombie has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_the_queue_limit_holds_under_parallel_submissions_to_two_nodes(
    make_node: NodeFactory, cluster_db: Sessions, tmp_path: Path
) -> None:
    limit = {"GPUMUX_MAX_QUEUED_PER_USER": "5"}
    nodes = [make_node("a", **limit), make_node("b", **limit)]
    command = [sys.executable, str(RELEASE_THEN_EXIT), str(tmp_path)]

    def post(number: int) -> int:
        body = {
            "params": ["x=0", f"y={number}"],
            "command": command,
            "workdir": str(tmp_path),
            "env": {"PATH": os.environ["PATH"]},
            "split": 1,
        }
        with nodes[number % 2].client() as client:
            return client.post("/sweeps", json=body).status_code

    with ThreadPoolExecutor(max_workers=20) as pool:
        answers = list(pool.map(post, range(20)))

    assert set(answers) <= {201, 429} and answers.count(201) >= 5
    with cluster_db.read() as session:
        trials = list(session.scalars(select(Trial)))
    started = [t for t in trials if t.status is not TrialStatus.queued]
    # Each node runs one trial at a time (split 1) and holds it until released: what was
    # accepted beyond the limit is exactly what the nodes took off the queue meanwhile.
    assert len(trials) == answers.count(201)
    assert len(trials) - len(started) <= 5
    (tmp_path / "release-0").touch()
    ended = wait_until("every trial to end", lambda: every_trial_ended(cluster_db), *nodes)
    assert {t.status for t in ended} == {TrialStatus.succeeded}


def every_trial_ended(db: Sessions) -> list[Trial] | None:
    with db.read() as session:
        trials = list(session.scalars(select(Trial)))
    return trials if all(t.status.is_final for t in trials) else None


PRINT_THEN_WAIT = (
    "import os, pathlib, sys, time\n"
    "print('hello from trial', os.environ['GPUMUX_TRIAL_ID'], flush=True)\n"
    "while not pathlib.Path(sys.argv[1]).exists():\n"
    "    time.sleep(0.05)\n"
)


def test_a_trials_log_is_read_through_another_node_which_then_stops_cleanly(
    make_node: NodeFactory, cluster_db: Sessions, tmp_path: Path
) -> None:
    b = make_node("b")
    release = tmp_path / "release"
    command = [sys.executable, "-c", PRINT_THEN_WAIT, str(release)]
    sweep_id = submit(b, tmp_path, ["x=1"], command)

    def running() -> list[Trial] | None:
        trials = trials_of(cluster_db, sweep_id)
        return trials if trials and all(t.status is TrialStatus.running for t in trials) else None

    (trial,) = wait_until("the trial to run on b", running, b)
    line = f"hello from trial {trial.id}\n"

    def logged() -> str | None:
        with b.client() as client:
            data: str = client.get(f"/trials/{trial.id}/log").json()["data"]
        return data if line in data else None

    on_b = wait_until("the trial's line in its log", logged, b)
    a = make_node("a")
    # Asked of a, which has no such log on its disk: a asks b for it, each time.
    with a.client() as client:
        answers = [client.get(f"/trials/{trial.id}/log") for _ in range(2)]
    assert [answer.status_code for answer in answers] == [200, 200], answers[-1].text
    assert [answer.json()["data"] for answer in answers] == [on_b, on_b]
    assert a.stop() == 0, a.log_tail()
    assert "Traceback" not in a.log_tail(200)
    release.touch()
    ended = wait_until("the trial to end", lambda: all_ended(cluster_db, sweep_id), b)
    assert [t.status for t in ended] == [TrialStatus.succeeded]
