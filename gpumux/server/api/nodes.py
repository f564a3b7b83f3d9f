"""Routes for the nodes that share the database: who they are, and a trial's log between them."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Request, status

from gpumux.devices.snapshot import DeviceSummary
from gpumux.fields import MAX_ID
from gpumux.schemas.nodes import NodeDevice, NodePublic
from gpumux.schemas.trials import LogChunk
from gpumux.server.api.deps import ReadSessionDep, StateDep, TrialId, get_caller
from gpumux.server.api.forward import NODE_SCHEME, parse_node_authorization
from gpumux.server.api.responses import AUTHENTICATED, problems
from gpumux.server.api.trials import LogLimit, LogOffset, log_chunk
from gpumux.storage import nodes
from gpumux.storage import trials as trial_store
from gpumux.storage.models import Node, utcnow

log = logging.getLogger(__name__)

router = APIRouter(tags=["nodes"])

NodeId = Annotated[int, Path(ge=1, le=MAX_ID, description="the node's id")]


@router.get("/nodes", dependencies=[Depends(get_caller)], responses=problems(*AUTHENTICATED))
def list_nodes(session: ReadSessionDep) -> list[NodePublic]:
    """Every node that joined the database: its state, lease, devices and active trials."""
    now = utcnow()
    held = nodes.active_trial_counts(session=session)
    return [
        NodePublic(
            id=node.id,
            name=node.name,
            state=node.state,
            incarnation=node.incarnation,
            url=node.url,
            pid=node.pid,
            devices=[
                NodeDevice(**summary.row())
                for summary in map(DeviceSummary.read, node.devices)
                if summary is not None
            ],
            started_at=node.started_at,
            heartbeat_at=node.heartbeat_at,
            lease_until=node.lease_until,
            live=nodes.lease_is_live(node, now),
            active_trials=held.get(node.id, 0),
        )
        for node in nodes.list_nodes(session=session)
    ]


def get_asking_node(request: Request, state: StateDep) -> Node:
    """The node asking, by the secret it shows (`Authorization: Node <id>:<secret>`)."""
    asked = parse_node_authorization(request.headers.get("authorization", ""))
    node = None
    if asked is not None:
        with state.sessions.read() as session:
            node = nodes.node_of_secret(session=session, node_id=asked[0], secret=asked[1])
    if node is None:
        log.warning("api: refused a node-only request from %s", request.client)
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "this route serves other nodes only (Authorization: Node <id>:<secret>), and "
            "these node credentials are unknown or stale: ask through the /trials routes",
            headers={"WWW-Authenticate": NODE_SCHEME},
        )
    return node


AskingNodeDep = Annotated[Node, Depends(get_asking_node)]


@router.get("/nodes/{node_id}/trials/{trial_id}/log", responses=problems(401, 404, 422))
def serve_trial_log(
    node_id: NodeId,
    trial_id: TrialId,
    asker: AskingNodeDep,
    state: StateDep,
    session: ReadSessionDep,
    offset: LogOffset = None,
    limit: LogLimit = 256 * 1024,
) -> LogChunk:
    """A trial's log read from this node's disk, for another node that a user asked."""
    here = state.node
    if here is None or here.id != node_id:
        who = "no node" if here is None else f"node {here.id} ({here.name})"
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"this daemon is {who}, not node {node_id}")
    trial = trial_store.get_trial(session=session, trial_id=trial_id)
    if trial is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"trial {trial_id} not found")
    log.info("api: node %s reads the log of trial %d", asker.name, trial_id)
    return log_chunk(trial, offset, limit)
