"""`gpumux nodes` and `gpumux devices` node by node: tables from constructed data, and both
commands against a real API that knows two nodes."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from builders import bearer, cpu_snapshot, served
from rich.console import Console
from test_cli import cli_env, gpumux, row

from gpumux.cli import nodes as nodes_cli
from gpumux.config import Settings
from gpumux.schemas.nodes import NodePublic
from gpumux.server.api import create_app
from gpumux.status import NodeState
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Node, token_hash, utcnow
from gpumux.storage.nodes import NodeIdentity

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
H100 = {"key": "gpu:0", "kind": "gpu", "name": "NVIDIA H100", "memory_mb": 81_559}


def node(name: str, **fields: Any) -> NodePublic:
    """A live node `name` with two H100s, its lease 30s ahead of NOW, with `fields` changed."""
    values: dict[str, Any] = dict(
        id=1,
        name=name,
        state=NodeState.active,
        incarnation=1,
        url=f"http://{name}:7070",
        pid=99,
        devices=[H100, H100 | {"key": "gpu:1"}],
        started_at=NOW - timedelta(hours=1),
        heartbeat_at=NOW - timedelta(seconds=5),
        lease_until=NOW + timedelta(seconds=30),
        live=True,
        active_trials=3,
    )
    return NodePublic.model_validate(values | fields)


def text(renderable: Any) -> str:
    console = Console(file=io.StringIO(), width=160, color_system=None)
    console.print(renderable)
    out = console.file
    assert isinstance(out, io.StringIO)
    return out.getvalue()


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.split("│")[1:-1]]


def test_the_table_shows_each_nodes_lease_left_or_how_long_ago_it_ran_out() -> None:
    shown = text(
        nodes_cli.nodes_table(
            [
                node("a"),
                node("b", live=False, lease_until=NOW - timedelta(seconds=75), url=None),
                node("c", state=NodeState.lost, live=False, heartbeat_at=NOW - timedelta(hours=2)),
            ],
            NOW,
        )
    )
    assert cells(row(shown, "│ a ")) == [
        "a",
        "active",
        "30.0s left",
        "2× NVIDIA H100",
        "3",
        "http://a:7070",
    ]
    assert cells(row(shown, "│ b "))[1:3] == ["active, lease ran out", "expired 0:01:15 ago"]
    assert cells(row(shown, "│ b "))[5] == "unix socket only"
    assert cells(row(shown, "│ c "))[1:3] == ["lost", "lost 2:00:00 ago"]


def stored_node(sessions: Sessions, name: str, url: str | None = None) -> NodeIdentity:
    with sessions.write.begin() as session:
        row = Node(
            name=name,
            home_id=name,
            pid=1,
            url=url,
            token_hash=token_hash(name),
            devices=[H100],
            lease_until=utcnow() + timedelta(minutes=1),
        )
        session.add(row)
        session.flush()
        return NodeIdentity(id=row.id, name=name, incarnation=1, secret=name)


def test_nodes_and_devices_against_an_api_that_knows_two_nodes(
    tmp_path: Path, settings: Settings, sessions: Sessions
) -> None:
    here = stored_node(sessions, "node-a", url="http://node-a:7070")
    stored_node(sessions, "node-b")
    cpu = cpu_snapshot(name="the CPU", cpu_count=4)
    app = create_app(settings=settings, sessions=sessions, devices_view=lambda: [cpu], node=here)
    headers = bearer(sessions)
    with served(app) as client:
        env = cli_env(
            home=tmp_path / "user",
            url=str(client.base_url),
            GPUMUX_TOKEN=headers["Authorization"].removeprefix("Bearer "),
        )
        listed = gpumux("nodes", env=env)
        devices = gpumux("devices", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "http://node-a:7070" in row(listed.stdout, "│ node-a ")
    assert "unix socket only" in row(listed.stdout, "│ node-b ")
    assert devices.returncode == 0, devices.stderr
    lines = [line.rstrip() for line in devices.stdout.splitlines()]
    assert lines.index("node node-a") < lines.index("node node-b")
    assert lines.index("node node-a") < lines.index(row(devices.stdout, "│ cpu ").rstrip())
    assert lines.index("node node-b") < lines.index(row(devices.stdout, "│ gpu:0 ").rstrip())
    assert "NVIDIA H100" in row(devices.stdout, "│ gpu:0 ")
