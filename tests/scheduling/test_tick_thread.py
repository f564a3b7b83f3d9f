"""The scheduler's tick runs in a thread of its own: a tick that waits (here on the database's
write lock, held by another writer) leaves the event loop it shares with the API and the node's
heartbeat free."""

from __future__ import annotations

import asyncio
import threading
import time

from gpumux.config import Settings
from gpumux.devices.probes import CpuProbe
from gpumux.scheduling.loop import Scheduler
from gpumux.storage.engine import Sessions

# How long another writer holds the write lock: the old scheduler, which ticked on the event
# loop, held the loop that long; a free loop answers within milliseconds.
HOLD_S = 3.0


def test_a_tick_that_waits_on_the_database_leaves_the_event_loop_free(
    settings: Settings, sessions: Sessions
) -> None:
    scheduler = Scheduler(
        settings=settings, sessions=sessions, probe=CpuProbe(), url="http://127.0.0.1:9"
    )
    held = threading.Event()

    def slow_writer() -> None:
        with sessions.write.begin() as session:
            session.connection()  # the write lock is taken as the transaction begins
            held.set()
            # A write transaction that takes this long (a slow disk, another tool).
            time.sleep(HOLD_S)

    writer = threading.Thread(target=slow_writer)
    writer.start()
    assert held.wait(30)

    async def loop_gaps() -> tuple[float, float]:
        """The longest the loop went without running a 20 ms timer while the tick ran, and
        how long the tick took."""
        began = time.monotonic()
        tick = asyncio.create_task(scheduler.tick())
        worst, last = 0.0, time.monotonic()
        while not tick.done():
            await asyncio.sleep(0.02)
            now = time.monotonic()
            worst, last = max(worst, now - last), now
        await tick
        return worst, time.monotonic() - began

    try:
        worst, took = asyncio.run(loop_gaps())
    finally:
        writer.join()
        scheduler.close()
    # The tick did wait for the lock (most of HOLD_S), and the loop ran meanwhile.
    assert took >= HOLD_S / 2
    assert worst < HOLD_S / 2, f"the event loop stalled {worst:.1f} s behind the tick"
