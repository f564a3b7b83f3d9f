"""Leaving when the queue is empty: a node daemon of a batch allocation (Slurm) gives its GPUs
back once no trial has been queued or running on its whole database for a grace time."""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy import exc

from gpumux.storage import backlog
from gpumux.storage.engine import Sessions

log = logging.getLogger(__name__)


class IdleClock:
    """Whether the database has had no work for `grace` seconds in a row (times are given)."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self._idle_since: float | None = None

    def observe(self, *, pending: int | None, now: float) -> bool:
        """Record what the database holds at `now` (None: it could not be read, which is not
        idle); True once it has held no work for the whole grace time."""
        if pending != 0:
            self._idle_since = None
            return False
        if self._idle_since is None:
            self._idle_since = now
        return now - self._idle_since >= self.grace


def pending_work(sessions: Sessions) -> int | None:
    """Trials queued, running, or yet to be asked by an adaptive sweep, on every node; None
    when the database cannot be read now."""
    try:
        with sessions.read() as session:
            return backlog.pending_work(session=session)
    except exc.DBAPIError as error:
        # A database busy or away for a moment says nothing about the queue: stay.
        log.warning("idle: cannot read the queue (%s); staying", error.orig)
        return None


async def until_idle(sessions: Sessions, *, grace: float, poll: float) -> None:
    """Return once no work has been pending on the database for `grace` seconds, looking every
    `poll` seconds (a sweep submitted meanwhile, on any node, starts the grace time again)."""
    clock = IdleClock(grace)
    while not clock.observe(pending=pending_work(sessions), now=time.monotonic()):
        await asyncio.sleep(poll)
