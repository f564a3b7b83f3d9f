"""The trial's side of a stop: gpumux's SIGTERM recorded, for a script that ends itself.

gpumux stops a trial (pruned, cancelled, out of time, daemon shutdown) with SIGTERM to its
process group, then SIGKILL after the grace period (GPUMUX_KILL_GRACE). A script that asks
`should_stop()` gets a handler that only records the SIGTERM, so that it can checkpoint and end.
"""

from __future__ import annotations

import signal
import threading

from gpumux.runtime.context import say

_requested = False
_installed = False
_warned = False
_warn_lock = threading.Lock()


def _record(signum: int, frame: object) -> None:
    global _requested
    _requested = True


def requested() -> bool:
    """Whether a SIGTERM came; the main thread's first ask installs the handler that records it."""
    global _installed
    if not _installed:
        if threading.current_thread() is not threading.main_thread():
            _warn_not_main_thread()
            return False
        previous = signal.signal(signal.SIGTERM, _record)
        _installed = True
        if callable(previous):
            say(
                f"should_stop() replaced this process's SIGTERM handler ({previous!r}): "
                "gpumux's stop request is now only recorded, and the script ends itself"
            )
    return _requested


def _warn_not_main_thread() -> None:
    global _warned
    with _warn_lock:
        if _warned:
            return
        _warned = True
    say(
        f"WARNING: should_stop() was first called from thread "
        f"{threading.current_thread().name!r}: only the main thread can handle SIGTERM, so it "
        "returns False, and a stop ends this trial at once, until the main thread calls "
        "should_stop() once (call it before starting threads)"
    )
