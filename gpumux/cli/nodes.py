"""`gpumux nodes`: the daemons that share the database; and devices shown node by node."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime

import typer
from rich.table import Table

from gpumux.cli import render
from gpumux.cli.commands import Url
from gpumux.cli.connect import connect
from gpumux.cli.state import get_state
from gpumux.schemas.devices import DevicePublic
from gpumux.schemas.nodes import NodePublic


def state_text(node: NodePublic) -> str:
    """The node's state; an active one whose lease ran out is about to be found lost."""
    if node.state == "active" and not node.live:
        return "active, lease ran out"
    return node.state.value


def lease_text(node: NodePublic, now: datetime) -> str:
    """How long the node's lease has left, or how long ago it ran out (or why it ended)."""
    if node.state != "active":
        return f"{node.state} {render.duration(render.since(node.heartbeat_at, now))} ago"
    left = (node.lease_until - now).total_seconds()
    if left > 0:
        return f"{render.duration(left)} left"
    return f"expired {render.duration(-left)} ago"


def devices_text(node: NodePublic) -> str:
    """ "2× NVIDIA H100, the CPU": the node's devices by model."""
    models = Counter(device.name for device in node.devices)
    return ", ".join(name if n == 1 else f"{n}× {name}" for name, n in models.items()) or "-"


def nodes_table(nodes: Sequence[NodePublic], now: datetime | None = None) -> Table:
    """One row per node: its state, its lease, its devices, its active trials, its URL."""
    now = now or datetime.now(UTC)
    table = Table(header_style="bold")
    table.add_column("node")
    table.add_column("state")
    table.add_column("lease", justify="right")
    table.add_column("devices", overflow="fold")
    table.add_column("trials", justify="right")
    table.add_column("url", overflow="fold")
    for node in nodes:
        table.add_row(
            render.visible(node.name),
            state_text(node),
            lease_text(node, now),
            render.visible(devices_text(node)),
            str(node.active_trials),
            render.visible(node.url) if node.url else "unix socket only",
        )
    return table


def by_node(devices: Sequence[DevicePublic]) -> dict[str | None, list[DevicePublic]]:
    """The devices in groups, one per node, in the order the daemon answered them."""
    groups: dict[str | None, list[DevicePublic]] = {}
    for device in devices:
        groups.setdefault(device.node, []).append(device)
    return groups


def nodes(ctx: typer.Context, url: Url = None) -> None:
    """The daemons that share the database: lease, devices, active trials, where each serves."""
    state = get_state(ctx)
    with connect(state, url) as client:
        found = client.nodes()
    if not found:
        state.note("no node has joined the database (a daemon from before nodes)")
        return
    state.out.print(nodes_table(found))


def devices(ctx: typer.Context, url: Url = None) -> None:
    """The devices trials are packed onto, node by node: memory, utilisation, trials on each."""
    state = get_state(ctx)
    with connect(state, url) as client:
        found = client.devices()
    if not found:
        state.note("the daemon sees no device")
        return
    for node, group in by_node(found).items():
        title = None if node is None else f"node {render.visible(node)}"
        state.out.print(render.devices_table(group, title))
