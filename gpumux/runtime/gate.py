"""Where `gpumux tune` launched a trial ahead of its round: the trial starts up beside the round
before, says it is ready to compute, and waits until that round has ended.

GPUMUX_GATE names the round's directory. A trial reaching the point where its work begins writes
an empty file there named by its trial id, then waits while the file `closed` is there and
locked; tune holds that lock while the gate is closed and removes the file as the round before
ends. A tune that was killed (even by SIGKILL: the kernel drops its lock) lets its trials go on,
rather than hold their slices of the device for ever. Without GPUMUX_GATE, or once passed, it
returns at once. The simulated trial calls it between its allocation and its steps, PyTorch's
step hook at the first optimizer step, Keras's fit() before it trains: a script that reaches
none of them is never launched ahead, since tune launches the next round only once every trial
of this one said it was ready.
"""

from __future__ import annotations

import fcntl
import os
import time

GATE_ENV = "GPUMUX_GATE"
CLOSED = "closed"
# Seconds between two looks at the gate: the device's idle time as the round before ends.
POLL_S = 0.02

_passed = False


def wait_for_turn() -> None:
    """Say this trial is ready, and wait while its round's gate is closed."""
    global _passed
    directory = os.environ.get(GATE_ENV)
    if _passed or not directory:
        return
    _passed = True
    ready = os.path.join(directory, os.environ.get("GPUMUX_TRIAL_ID") or str(os.getpid()))
    try:
        os.close(os.open(ready, os.O_CREAT | os.O_WRONLY, 0o600))
    except OSError:
        # Not said ready: tune launches no round ahead beside this one.
        return
    closed = os.path.join(directory, CLOSED)
    while not _may_pass(closed):
        time.sleep(POLL_S)


def _may_pass(closed: str) -> bool:
    """Whether the gate is open, or its holder gone: no `closed` file, or no lock held on it."""
    try:
        descriptor = os.open(closed, os.O_RDONLY)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(descriptor)
    return True
