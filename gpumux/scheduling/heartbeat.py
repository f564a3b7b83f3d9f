"""The node's heartbeat: renew this node's lease, expire the nodes whose lease lapsed, and
when this node's own lease was lost, stop its trials and join again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from gpumux.config import Settings
from gpumux.devices.snapshot import DeviceSummary
from gpumux.processes import rundir
from gpumux.scheduling.launching import node_lease_file
from gpumux.scheduling.loop import Scheduler
from gpumux.storage import membership
from gpumux.storage.engine import Sessions
from gpumux.storage.nodes import NodeIdentity

log = logging.getLogger(__name__)

T = TypeVar("T")


def record_lease(settings: Settings, sessions: Sessions, *, renewed_at: float | None) -> None:
    """Tell this host's supervisors until when they may run the node's trials: the lease
    renewed at `renewed_at` (boottime(), taken before the renewal began) less one heartbeat,
    so that they stop a heartbeat before any other node may requeue them (the lease exceeds
    two heartbeats, so the next renewal comes first); None: the lease is lost."""
    path = node_lease_file(settings, sessions)
    if path is None:
        return
    until = 0.0
    if renewed_at is not None:
        until = renewed_at + settings.node_lease - settings.node_heartbeat
    rundir.write_lease(path, until=until)


class NodeHeartbeat:
    """Every GPUMUX_NODE_HEARTBEAT seconds: renew the lease, then expire lapsed nodes.

    Its database work runs in a thread of its own: neither the scheduler's tick (in its own
    thread) nor the API's requests delay a renewal; only another write's short transaction
    may (PostgreSQL's write lock, SQLite's single writer)."""

    def __init__(
        self,
        *,
        settings: Settings,
        sessions: Sessions,
        scheduler: Scheduler,
        node: NodeIdentity,
        url: str | None,
        home: str,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.scheduler = scheduler
        self.node = node
        # What a rejoin registers again.
        self.url = url
        self.home = home
        # False from a lost lease until the node has joined again.
        self.held = True
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpumux-heartbeat")

    async def run(self, stop: asyncio.Event) -> None:
        """Beat until `stop` is set; a database that fails is logged and tried again."""
        while not stop.is_set():
            try:
                await self.beat()
            except Exception as error:
                # Trials run on under their supervisors; the lease may lapse meanwhile, and the
                # next beat that reaches the database finds out.
                log.error("node %s: heartbeat failed (%s); trying again", self.node.name, error)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.settings.node_heartbeat)
        self._thread.shutdown(wait=True)

    async def beat(self) -> None:
        """One heartbeat: renew (or rejoin after a loss), and expire the lapsed nodes."""
        devices = [DeviceSummary.of(device).row() for device in self.scheduler.devices]
        if self.held:
            renewed_at = rundir.boottime()
            self.held, expired = await self._in_thread(self._renew, devices)
            record_lease(self.settings, self.sessions, renewed_at=renewed_at if self.held else None)
            if expired:
                # Their trials are queued again: fill our free slots with them.
                self.scheduler.wake()
            if not self.held:
                log.warning(
                    "node %s: lease of incarnation %d lost (another node requeued its trials); "
                    "killing its %d trials and joining again",
                    self.node.name,
                    self.node.incarnation,
                    self.scheduler.running_count,
                )
                await self.scheduler.abandon()
        if not self.held:
            renewed_at = rundir.boottime()
            self.node = await self._in_thread(self._rejoin, devices)
            record_lease(self.settings, self.sessions, renewed_at=renewed_at)
            self.held = True
            await self.scheduler.use_node(self.node)
            log.warning(
                "node %s: joined again as incarnation %d", self.node.name, self.node.incarnation
            )

    async def _in_thread(self, work: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, work, *args)

    def _renew(self, devices: list[dict[str, Any]]) -> tuple[bool, list[str]]:
        with self.sessions.write.begin() as session:
            held = membership.heartbeat(
                session=session, node=self.node, lease_s=self.settings.node_lease, devices=devices
            )
            expired = membership.expire(session=session, lost_retries=self.settings.lost_retries)
        return held, expired

    def _rejoin(self, devices: list[dict[str, Any]]) -> NodeIdentity:
        with self.sessions.write.begin() as session:
            return membership.join(
                session=session,
                name=self.node.name,
                home=self.home,
                url=self.url,
                pid=os.getpid(),
                lease_s=self.settings.node_lease,
                lost_retries=self.settings.lost_retries,
                devices=devices,
                # The API's copy of this node's identity keeps showing the same secret.
                secret=self.node.secret,
            )

    def leave(self) -> None:
        """At a clean stop: leave the cluster unless trials were left running."""
        if not self.held:
            return
        with self.sessions.write.begin() as session:
            if membership.leave(session=session, node=self.node):
                log.info("node %s: left", self.node.name)
