"""A trial's log asked of the node that holds it: node-to-node requests, shown a node's secret."""

from __future__ import annotations

import logging
import threading

import httpx
from fastapi import HTTPException, status
from pydantic import ValidationError

from gpumux.schemas.trials import LogChunk
from gpumux.server import identity
from gpumux.status import NodeState
from gpumux.storage.models import Node, Trial, utcnow
from gpumux.storage.nodes import NodeIdentity, lease_is_live

log = logging.getLogger(__name__)

NODE_SCHEME = "Node"
# A node that does not answer in this long is taken as unreachable: the user is waiting.
FORWARD_TIMEOUT_S = 10.0
# An idle connection to another node is dropped after this long, before that node's uvicorn
# closes it (5 s keep-alive): a request never goes out on a connection closing under it.
FORWARD_KEEPALIVE_S = 2.0


class NodeClient:
    """The HTTP client this daemon asks other nodes with, one for the daemon's life: made at
    its first request (the CA bundle loaded once, connections to each node kept between
    requests), closed when the daemon stops."""

    def __init__(self) -> None:
        # Routes run in a thread pool: two first requests at once still make one client.
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None

    def client(self) -> httpx.Client:
        """The client, made at the first call."""
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(
                    timeout=FORWARD_TIMEOUT_S,
                    limits=httpx.Limits(keepalive_expiry=FORWARD_KEEPALIVE_S),
                )
            return self._client

    def close(self) -> None:
        """Close the client and its connections, if one was made."""
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


def node_authorization(node: NodeIdentity) -> str:
    """The Authorization header this node shows another: `Node <id>:<secret>`."""
    return f"{NODE_SCHEME} {node.id}:{node.secret}"


def parse_node_authorization(header: str) -> tuple[int, str] | None:
    """The node id and secret of a `Node <id>:<secret>` header, or None for anything else."""
    node_id, _, secret = (identity.credentials(header, NODE_SCHEME) or "").partition(":")
    if not node_id.isascii() or not node_id.isdigit():
        return None
    return (int(node_id), secret) if secret else None


def _unavailable(trial: Trial, holder: Node | None) -> str | None:
    """Why the node holding the trial cannot be asked for its log, or None if it can."""
    where = f"trial {trial.id}'s log is on the disk of node"
    if holder is None:
        return f"{where} id {trial.node_id}, which is not among the nodes: read it on that host"
    if not lease_is_live(holder, utcnow()):
        gone = "has left" if holder.state is NodeState.left else "lost its lease"
        return f"{where} {holder.name}, which {gone}: read {trial.log_path} on that host"
    if holder.url is None:
        return (
            f"{where} {holder.name}, which serves no TCP (a Unix socket only): run "
            f"`gpumux logs {trial.id}` on that host, or give its daemon a TCP port"
        )
    return None


def trial_log(
    *,
    node_client: NodeClient,
    asker: NodeIdentity,
    holder: Node | None,
    trial: Trial,
    offset: int | None,
    limit: int,
) -> LogChunk:
    """The trial's log as the node holding it serves it; 502/503 saying why it cannot."""
    why = _unavailable(trial, holder)
    if why is not None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, why)
    assert holder is not None and holder.url is not None
    params: dict[str, int] = (
        {"limit": limit} if offset is None else {"offset": offset, "limit": limit}
    )
    url = f"{holder.url.rstrip('/')}/nodes/{holder.id}/trials/{trial.id}/log"
    try:
        response = node_client.client().get(
            url, params=params, headers={"Authorization": node_authorization(asker)}
        )
    except httpx.HTTPError as error:
        log.warning("api: node %s at %s unreachable: %s", holder.name, holder.url, error)
        raise HTTPException(
            status.HTTP_502_BAD_GATEWAY,
            f"node {holder.name}, which holds trial {trial.id}, cannot be reached at "
            f"{holder.url} ({error}): is its daemon up and its port open to this node?",
        ) from error
    return _chunk_of(response, holder, trial)


def _chunk_of(response: httpx.Response, holder: Node, trial: Trial) -> LogChunk:
    """The LogChunk the holding node answered, or its refusal passed on."""
    if response.status_code == status.HTTP_200_OK:
        try:
            return LogChunk.model_validate_json(response.content)
        except ValidationError as error:
            detail = f"an answer that is no log chunk ({error.error_count()} errors)"
    else:
        try:
            detail = str(response.json()["detail"])
        except (ValueError, KeyError, TypeError):
            detail = f"HTTP {response.status_code}"
        if response.status_code not in (401, 403):
            # Its own verdict on the trial (404, 500...): the user meets it as the node said it.
            raise HTTPException(response.status_code, f"node {holder.name}: {detail}")
    raise HTTPException(
        status.HTTP_502_BAD_GATEWAY,
        f"node {holder.name} at {holder.url} refused the log of trial {trial.id}: {detail}",
    )
