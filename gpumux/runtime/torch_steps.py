"""Count an unmodified PyTorch script's optimizer steps and report them as its throughput.

PyTorch runs a global hook after every optimizer's step (PyTorch 2.0 and later), so plain loops,
Lightning and Hugging Face's Trainer are counted alike, with no change to the script. Reports go
one per REPORT_INTERVAL_S at most (a report costs the daemon a write), and what is left at exit.
A script that reports samples itself (gpumux.runtime.report(samples=...)) is measured by those:
from its first such report on, no steps are sent.
"""

from __future__ import annotations

import atexit
import importlib
import threading
import time

from gpumux.runtime import frameworks, gate, reporter
from gpumux.runtime.context import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType

# The Keras hook's heartbeat: two reports fall inside the split search's shortest window.
REPORT_INTERVAL_S = 2.0


class StepCounter:
    """Optimizer steps since the last report, and when that report went."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Like report()'s first interval, the first one starts when the runtime set up: its
        # rate counts the script's start, as the split search's rates do.
        self._mark = time.monotonic()
        self._steps = 0
        self._stepped = False

    def on_step(self, optimizer: object, args: object, kwargs: object) -> None:
        """PyTorch's post-step hook: count the step, report once an interval has passed."""
        if not self._stepped:
            self._stepped = True
            frameworks.training_with("torch")
            # Launched ahead by gpumux tune, it waits here for the round before to end: no part
            # of its rate, which counts the script's start and its steps.
            waiting = time.monotonic()
            gate.wait_for_turn()
            with self._lock:
                self._mark += time.monotonic() - waiting
        now = time.monotonic()
        with self._lock:
            self._steps += 1
            if now - self._mark < REPORT_INTERVAL_S:
                return
            steps, seconds = self._take(now)
        _send(steps, seconds)

    def flush(self) -> None:
        """Report the steps not reported yet (at exit), and wait for the reports to go."""
        with self._lock:
            steps, seconds = self._take(time.monotonic())
        if steps:
            _send(steps, seconds)
        current = reporter.current()
        if current is not None:
            current.flush(reporter.EXIT_FLUSH_TIMEOUT_S)

    def _take(self, now: float) -> tuple[int, float]:
        steps, seconds = self._steps, now - self._mark
        self._steps, self._mark = 0, now
        return steps, seconds


def _send(steps: int, seconds: float) -> None:
    current = reporter.current()
    if current is None or current.reports_samples:
        return
    current.submit(kind="steps", step=None, samples=None, seconds=seconds, metrics={}, steps=steps)


def count_steps(torch: ModuleType) -> StepCounter | None:
    """Hook every optimizer's step in this process; None when this PyTorch has no global hook."""
    try:
        # A submodule torch.optim does not keep as an attribute; imported by then with torch.
        optimizer = importlib.import_module("torch.optim.optimizer")
    except ImportError:
        optimizer = None
    register = getattr(optimizer, "register_optimizer_step_post_hook", None)
    if register is None:
        say(
            f"torch: {getattr(torch, '__version__', 'this version')} has no global optimizer "
            "hook (PyTorch 2.0 has); report samples with gpumux.runtime.report(samples=...) "
            "for a throughput"
        )
        return None
    counter = StepCounter()
    register(counter.on_step)
    atexit.register(counter.flush)
    return counter
