"""The cluster seen from any node: GET /nodes, /devices grouped by node, a trial's log
asked of the node that holds it (two real daemons' APIs on one database)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import MISSING, dataclass, fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from builders import bearer, problem, served, stored_sweep
from pydantic import TypeAdapter

from gpumux.config import Settings
from gpumux.devices.snapshot import DeviceSnapshot, DeviceSummary
from gpumux.schemas.nodes import NodeDevice, NodePublic
from gpumux.server.api import create_app
from gpumux.server.api.forward import NodeClient
from gpumux.status import NodeState, TrialStatus
from gpumux.storage import lifecycle
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Node, token_hash, utcnow
from gpumux.storage.nodes import NodeIdentity

H100 = {"key": "gpu:0", "kind": "gpu", "name": "NVIDIA H100", "memory_mb": 81_559}
LOG_TEXT = "epoch 1 loss=0.5\nepoch 2 loss=0.25\n"


def stored_node(sessions: Sessions, name: str, **fields: Any) -> NodeIdentity:
    """A node row as a join writes one (secret "secret-NAME", a lease of a minute)."""
    secret = f"secret-{name}"
    fields.setdefault("lease_until", utcnow() + timedelta(minutes=1))
    fields.setdefault("devices", [H100])
    with sessions.write.begin() as session:
        node = Node(
            name=name,
            home_id=f"home-{name}",
            pid=4242,
            token_hash=token_hash(secret),
            **fields,
        )
        session.add(node)
        session.flush()
        return NodeIdentity(id=node.id, name=name, incarnation=1, secret=secret)


def update_node(sessions: Sessions, node_id: int, **fields: Any) -> None:
    with sessions.write.begin() as session:
        node = session.get(Node, node_id)
        assert node is not None
        for name, value in fields.items():
            setattr(node, name, value)


def trials_on(
    sessions: Sessions, tmp_path: Path, node: NodeIdentity, split: int, n: int = 1
) -> list[int]:
    """`n` trials of a new sweep started on `node`'s gpu:0 at `split`; their ids."""
    with sessions.write.begin() as session:
        sweep = stored_sweep(session, tmp_path, n)
        trials = trial_store.list_trials(session=session, sweep_id=sweep.id)[0]
        for slot, trial in enumerate(trials):
            lifecycle.set_trial_status(
                session=session,
                trial=trial,
                status=TrialStatus.starting,
                device="gpu:0",
                slot=slot,
                split=split,
                node_id=node.id,
            )
        return [trial.id for trial in trials]


def gpu(memory_used_mb: int) -> DeviceSnapshot:
    return DeviceSnapshot(
        key="gpu:0",
        kind="gpu",
        index=0,
        name="NVIDIA H200",
        uuid="GPU-0",
        memory_total_mb=143_771,
        memory_used_mb=memory_used_mb,
        memory_free_mb=143_771 - memory_used_mb,
        utilization_pct=50,
        processes=(),
        cpu_count=None,
    )


def test_nodes_lists_every_node_with_its_lease_devices_and_trials(
    tmp_path: Path, settings: Settings, sessions: Sessions
) -> None:
    a = stored_node(sessions, "a", url="http://a:7070")
    b = stored_node(sessions, "b", lease_until=utcnow() - timedelta(seconds=5))
    stored_node(sessions, "c", state=NodeState.left)
    trials_on(sessions, tmp_path, a, split=4, n=3)
    app = create_app(settings=settings, sessions=sessions, node=a)
    with served(app, bearer(sessions)) as client:
        response = client.get("/nodes")
        refused = client.get("/nodes", headers={"Authorization": "Bearer gmx_nope"})
    assert response.status_code == 200, response.text
    seen = {node["name"]: node for node in response.json()}
    assert list(seen) == ["a", "b", "c"]
    assert (seen["a"]["live"], seen["a"]["active_trials"], seen["a"]["url"]) == (
        True,
        3,
        "http://a:7070",
    )
    assert seen["a"]["devices"] == [H100]
    assert (seen["b"]["live"], seen["b"]["state"], seen["b"]["url"]) == (False, "active", None)
    assert (seen["c"]["live"], seen["c"]["state"]) == (False, "left")
    assert b.id == seen["b"]["id"]
    assert not any("token" in field for node in seen.values() for field in node)
    assert problem(refused, 401).detail.startswith("the token is unknown")


def test_devices_of_every_active_node_each_with_the_mix_of_its_own_trials(
    tmp_path: Path, settings: Settings, sessions: Sessions
) -> None:
    a = stored_node(sessions, "a")
    b = stored_node(sessions, "b")
    stored_node(sessions, "gone", state=NodeState.lost)
    on_a = trials_on(sessions, tmp_path, a, split=2)
    on_b = trials_on(sessions, tmp_path, b, split=4, n=2)
    app = create_app(
        settings=settings, sessions=sessions, devices_view=lambda: [gpu(9_000)], node=a
    )
    with served(app, bearer(sessions)) as client:
        response = client.get("/devices")
    assert response.status_code == 200, response.text
    found = [(device["node"], device["key"]) for device in response.json()]
    assert found == [("a", "gpu:0"), ("b", "gpu:0")], "this node first, then the others; no lost"
    here, there = response.json()
    # The same key on two nodes: each counts only the trials whose attempt is on it.
    assert [trial["trial_id"] for trial in here["trials"]] == on_a
    assert here["load_fraction"] == "1/2"
    assert (here["name"], here["memory_used_mb"]) == ("NVIDIA H200", 9_000)
    assert [trial["trial_id"] for trial in there["trials"]] == on_b
    assert there["load_fraction"] == "1/2"
    assert (there["name"], there["memory_total_mb"], there["memory_used_mb"]) == (
        "NVIDIA H100",
        81_559,
        None,
    )


def test_a_device_entry_of_another_shape_is_left_out_of_nodes_and_devices_not_a_500(
    tmp_path: Path, settings: Settings, sessions: Sessions
) -> None:
    # What a node of another gpumux version may have written beside an entry of today's shape.
    odd = [{"key": "gpu:1", "kind": "gpu"}, "gpu:2", {**H100, "key": "gpu:3", "memory_mb": "80G"}]
    mig = {"key": "mig:0/1", "kind": "mig", "name": "1g.10gb", "memory_mb": 9_728}
    here = stored_node(sessions, "a")
    stored_node(sessions, "b", devices=[*odd, H100, mig])
    app = create_app(
        settings=settings, sessions=sessions, devices_view=lambda: [gpu(9_000)], node=here
    )
    with served(app, bearer(sessions)) as client:
        listed = client.get("/nodes")
        devices = client.get("/devices")
    assert listed.status_code == devices.status_code == 200, listed.text + devices.text
    assert {node["name"]: node["devices"] for node in listed.json()}["b"] == [H100, mig]
    assert [(d["node"], d["key"]) for d in devices.json()] == [
        ("a", "gpu:0"),
        ("b", "gpu:0"),
        ("b", "mig:0/1"),
    ]


def test_a_device_summary_reads_back_what_a_heartbeat_writes() -> None:
    device = gpu(9_000)
    summary = DeviceSummary.of(device)
    assert DeviceSummary.read(summary.row()) == summary
    assert summary.snapshot().memory_total_mb == device.memory_total_mb
    seventh = DeviceSummary.read({**H100, "key": "gpu:7"})
    assert seventh is not None and seventh.snapshot().index == 7
    assert DeviceSummary.read({**H100, "name": None}) is None


def test_the_api_shows_a_nodes_device_with_every_field_of_its_summary() -> None:
    written = fields(DeviceSummary)
    shown = TypeAdapter(NodePublic).json_schema()["$defs"]["NodeDevice"]
    assert list(shown["properties"]) == [field.name for field in written]
    assert shown["required"] == [field.name for field in written if field.default is MISSING]
    summary = DeviceSummary.read(H100)
    assert summary is not None
    assert NodeDevice(**summary.row()).row() == summary.row()


@dataclass(frozen=True)
class Pair:
    """Two nodes' APIs on one database, a user's client of node A, a trial on node B."""

    a: httpx.Client
    b: httpx.Client
    node_a: NodeIdentity
    node_b: NodeIdentity
    trial_id: int
    # What node A asks node B with.
    node_client: NodeClient


@pytest.fixture
def pair(tmp_path: Path, settings: Settings, sessions: Sessions) -> Iterator[Pair]:
    node_a = stored_node(sessions, "a")
    node_b = stored_node(sessions, "b")
    (trial_id,) = trials_on(sessions, tmp_path, node_b, split=1)
    log_path = tmp_path / "b-disk" / f"trial-{trial_id}.log"
    log_path.parent.mkdir()
    log_path.write_text(LOG_TEXT)
    with sessions.write.begin() as session:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        trial.log_path = str(log_path)
    node_client = NodeClient()
    app_a = create_app(settings=settings, sessions=sessions, node=node_a, node_client=node_client)
    app_b = create_app(settings=settings, sessions=sessions, node=node_b)
    with served(app_a, bearer(sessions)) as a, served(app_b) as b:
        update_node(sessions, node_a.id, url=str(a.base_url))
        update_node(sessions, node_b.id, url=str(b.base_url))
        try:
            yield Pair(a, b, node_a, node_b, trial_id, node_client)
        finally:
            # Before B's server is given back: A's connection to it is closed, not left to idle.
            node_client.close()


def test_a_trials_log_read_through_another_node_comes_from_the_node_that_holds_it(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpumux.server.api.nodes")
    response = pair.a.get(f"/trials/{pair.trial_id}/log", params={"offset": 6, "limit": 10})
    assert response.status_code == 200, response.text
    chunk = response.json()
    assert (chunk["trial_id"], chunk["offset"], chunk["data"]) == (pair.trial_id, 6, LOG_TEXT[6:16])
    assert chunk["next_offset"] == 16
    tail = pair.a.get(f"/trials/{pair.trial_id}/log").json()
    assert tail["data"] == LOG_TEXT
    assert f"node a reads the log of trial {pair.trial_id}" in caplog.text, "B served it"


def test_forwarded_requests_share_one_client_until_it_is_closed(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[httpx.Client] = []
    init = httpx.Client.__init__

    def counted(client: httpx.Client, *args: Any, **kwargs: Any) -> None:
        made.append(client)
        init(client, *args, **kwargs)

    monkeypatch.setattr(httpx.Client, "__init__", counted)
    for offset in (0, 6, 17):
        response = pair.a.get(f"/trials/{pair.trial_id}/log", params={"offset": offset})
        assert response.status_code == 200, response.text
        assert response.json()["data"] == LOG_TEXT[offset:]
    # One client (one CA bundle loaded), made by the first request, the others reusing it.
    assert len(made) == 1 and pair.node_client.client() is made[0]
    pair.node_client.close()
    assert made[0].is_closed


def test_a_node_that_cannot_be_reached_is_a_502_naming_it_and_its_url(
    pair: Pair, sessions: Sessions
) -> None:
    closed = "http://127.0.0.1:9"
    update_node(sessions, pair.node_b.id, url=closed)
    detail = problem(pair.a.get(f"/trials/{pair.trial_id}/log"), 502).detail
    assert f"node b, which holds trial {pair.trial_id}, cannot be reached at {closed}" in detail


def test_a_node_without_tcp_or_without_its_lease_is_a_503_saying_where_the_log_is(
    tmp_path: Path, pair: Pair, sessions: Sessions
) -> None:
    update_node(sessions, pair.node_b.id, url=None)
    detail = problem(pair.a.get(f"/trials/{pair.trial_id}/log"), 503).detail
    assert "node b, which serves no TCP" in detail
    update_node(sessions, pair.node_b.id, url="http://127.0.0.1:9", state=NodeState.lost)
    detail = problem(pair.a.get(f"/trials/{pair.trial_id}/log"), 503).detail
    assert f"on the disk of node b, which lost its lease: read {tmp_path}/b-disk/" in detail


def test_the_node_route_refuses_a_wrong_secret_an_unknown_node_and_a_users_token(
    pair: Pair, sessions: Sessions
) -> None:
    path = f"/nodes/{pair.node_b.id}/trials/{pair.trial_id}/log"
    good = {"Authorization": f"Node {pair.node_a.id}:{pair.node_a.secret}"}
    assert pair.b.get(path, headers=good).json()["data"] == LOG_TEXT
    for header in (
        f"Node {pair.node_a.id}:secret-b",
        f"Node 999:{pair.node_a.secret}",
        f"Node {pair.node_a.id}:",
        "Node a",
        bearer(sessions)["Authorization"],
        "",
    ):
        refused = pair.b.get(path, headers={"Authorization": header})
        assert "serves other nodes only" in problem(refused, 401).detail, header
    not_b = pair.a.get(f"/nodes/{pair.node_b.id}/trials/{pair.trial_id}/log", headers=good)
    assert problem(not_b, 404).detail == (
        f"this daemon is node {pair.node_a.id} (a), not node {pair.node_b.id}"
    )


def test_a_node_that_left_is_refused_though_its_secret_matches(
    pair: Pair, sessions: Sessions
) -> None:
    update_node(sessions, pair.node_a.id, state=NodeState.left)
    path = f"/nodes/{pair.node_b.id}/trials/{pair.trial_id}/log"
    headers = {"Authorization": f"Node {pair.node_a.id}:{pair.node_a.secret}"}
    problem(pair.b.get(path, headers=headers), 401)
