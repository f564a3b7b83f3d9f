"""A report flood against a real daemon: the flooding trial's sweep, and a /health prober."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

FLOOD = Path(__file__).parent / "fixtures" / "flood.py"
# Lines over few steps (coalesced to a row per step), then lines of a new step each (dropped
# past the rows an attempt may keep). Enough that the old daemon, which read and stored every
# line on its event loop, held /health for tens of seconds on this 2-core machine; a few
# seconds of Python.
LINES = 200_000
STEPS = 40
TAIL = 5_000
# The most report rows the flooded daemons keep per trial (GPUMUX_REPORT_ROWS): below what
# the flood would store unbounded, above what its STEPS need.
ROWS = 150
# No /health may take longer: the old daemon took over 30 s here (its end-of-trial drain),
# a daemon that never blocks its loop answers in milliseconds even on a loaded machine.
HEALTH_BOUND_S = 5.0


def flood_sweep(workdir: Path, **extra: Any) -> dict[str, Any]:
    """A sweep of one flooding trial, its objective the loss it prints."""
    return {
        "params": ["x=1"],
        "command": [sys.executable, str(FLOOD), str(LINES), str(STEPS), str(TAIL)],
        "workdir": str(workdir),
        "env": {"PATH": os.environ["PATH"]},
        "split": 1,
        "objective": "loss:min",
        **extra,
    }


def last_value_per_step() -> dict[int, float]:
    """What the flood's stepped part reported last at each step."""
    return {step: float(((step + 1) * LINES - 1) // STEPS) for step in range(STEPS)}


class HealthProbe:
    """GETs /health back to back in a thread; the longest answer (a timeout counts as the
    timeout) and how many were asked."""

    def __init__(self, url: str, headers: dict[str, str], timeout: float = 120.0) -> None:
        self._client = httpx.Client(base_url=url, headers=headers, timeout=timeout)
        self._stop = threading.Event()
        self.worst = 0.0
        self.count = 0
        self.failures: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self._client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                status = self._client.get("/health").status_code
                if status != 200:
                    self.failures.append(f"status {status}")
            except httpx.HTTPError as error:
                self.failures.append(repr(error))
            self.worst = max(self.worst, time.monotonic() - began)
            self.count += 1
            self._stop.wait(0.05)
