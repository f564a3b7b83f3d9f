"""The in-trial library: a trial's parameters, its reports to the gpumux daemon, its stop request.

Runs inside the user's training process, which may be another interpreter without gpumux installed
(the bootstrap sitecustomize makes this package importable there). It imports only the standard
library, lazily, and nothing else from gpumux. Outside gpumux every function is harmless.
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["in_trial", "params", "report", "should_stop"]

# The largest step the daemon stores (its schema's bound for ReportIn.step).
MAX_STEP = 2**31 - 1

# The interval of the first report() starts when the runtime is loaded, which under gpumux is
# when the interpreter starts (the bootstrap loads it).
_previous_report_at = time.monotonic()


def in_trial() -> bool:
    """Whether this process runs as a gpumux trial."""
    return bool(os.environ.get("GPUMUX_TRIAL_ID"))


def params() -> dict[str, Any]:
    """This trial's parameters (GPUMUX_PARAMS); {} outside gpumux."""
    raw = os.environ.get("GPUMUX_PARAMS")
    if not in_trial() or not raw:
        return {}
    import json

    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError(f"GPUMUX_PARAMS is not a JSON object: {raw!r}")
    return value


def report(samples: float | None = None, *, step: int | None = None, **metrics: float) -> None:
    """Report metrics at a step and the samples since the previous report(); no-op outside gpumux.

    `step` is the epoch or iteration (an int from 0) the metrics belong to; the pruner compares
    trials at the same step. A bad step raises TypeError or ValueError, in or outside gpumux.
    The interval is measured here; the first one starts when gpumux.runtime was loaded, which
    under gpumux is at interpreter start.
    """
    global _previous_report_at
    if step is not None:
        step = _checked_step(step)
    now = time.monotonic()
    seconds, _previous_report_at = now - _previous_report_at, now
    if not in_trial():
        return
    from gpumux.runtime import reporter

    reporter.submit(kind="manual", step=step, samples=samples, seconds=seconds, metrics=metrics)


def should_stop() -> bool:
    """Whether gpumux has asked this trial to stop (pruned, cancelled, out of time, shutdown).

    The first call, from the main thread, opts in: gpumux's SIGTERM is then only recorded, and
    the script ends itself (a checkpoint first) within the grace period, or is killed. Until
    that call a SIGTERM ends the process at once. False outside gpumux, where nothing is changed.
    """
    if not in_trial():
        return False
    from gpumux.runtime import stopping

    return stopping.requested()


def _checked_step(step: int) -> int:
    # Any integer type (numpy's too) is an int here; a bool is refused, as the daemon refuses it.
    import operator

    try:
        number: int | None = operator.index(step)
    except TypeError:
        number = None
    if number is None or isinstance(step, bool):
        raise TypeError(
            f"report(step=...) takes an int, the epoch or iteration counted from 0, "
            f"not {type(step).__name__} {step!r}"
        )
    if not 0 <= number <= MAX_STEP:
        raise ValueError(f"report(step={number}): the step must be from 0 to {MAX_STEP}")
    return number
