"""The GPUMUX_REPORT line protocol, the daemon's side: a trial's log in, its report lines out.

A script that imports nothing reports by printing one line to its output (flushed):
``GPUMUX_REPORT {"step": 3, "samples": 512, "val_loss": 0.41}``: `step` (an int from 0, optional),
`samples` (a finite number >= 0, processed since the previous report, optional), `pool_mb` (an
int >= 0, optional: the device memory in MiB the framework's pool holds now, which tells the
trial's CUDA context from NVML's figure, as the runtime reports PyTorch's), and every other
key a metric (named by 1 to 200 characters, no NUL; finite numbers, other values are dropped).
The log holds stdout and stderr alike; the line must start with the prefix (a progress bar
redrawn with \\r on the same line hides it).
The scheduler feeds each running trial's log to a `ReportLines` as the log grows; this module
only parses (standard library, no I/O).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import NamedTuple

PREFIX = b"GPUMUX_REPORT "
# A longer line is skipped to its end rather than held: the log is the trial's to fill.
MAX_LINE_BYTES = 64 * 1024
# ReportIn's bounds (gpumux.schemas.reports), mirrored: a line may hold no more than a report may.
MAX_STEP = 2**31 - 1
MAX_POOL_MB = 2**31 - 1
MAX_SAMPLES = 1e12
MAX_METRICS = 256
MAX_METRIC_CHARS = 200
EXCERPT_CHARS = 80
EXAMPLE = 'GPUMUX_REPORT {"step": 3, "val_loss": 0.41}'
TOO_LONG = f"longer than {MAX_LINE_BYTES} bytes; skipped to its end"


@dataclass(frozen=True, slots=True)
class LineReport:
    """One report line: the step its metrics belong to, samples since the previous report,
    the framework's memory pool."""

    step: int | None
    samples: float | None
    metrics: dict[str, float]
    pool_mb: int | None = None


@dataclass(frozen=True, slots=True)
class RejectedLine:
    """A GPUMUX_REPORT line that cannot be used; `reason` is one line that says why."""

    reason: str


class Fed(NamedTuple):
    """What one chunk gave: the report lines it completed, and the bytes of complete lines."""

    items: list[LineReport | RejectedLine]
    consumed: int


class ReportLines:
    """Finds and parses the report lines of one attempt's log, fed in chunks as it grows.

    Keep one per attempt and feed it each new byte once; add each `consumed` to the stored
    offset (`Trial.log_scanned`), and read on from that offset plus `pending`. A new one (after
    a restart) starts at the stored offset, the start of a line: a line in progress is read again.
    """

    def __init__(self) -> None:
        # The line in progress while it may be a report; dropped as soon as it cannot be one.
        self._line = bytearray()
        self._skipping = False
        self._pending = 0

    @property
    def pending(self) -> int:
        """Bytes fed but not yet consumed: those of the line in progress."""
        return self._pending

    def feed(self, data: bytes) -> Fed:
        """Take the next bytes of the log (a chunk may end anywhere, even inside a character)."""
        items: list[LineReport | RejectedLine] = []
        first = data.find(b"\n")
        if first < 0:
            self._take(data, 0, len(data), items)
            self._pending += len(data)
            return Fed(items, 0)
        self._take(data, 0, first, items)
        if not self._skipping and self._line.startswith(PREFIX):
            items.append(parse(bytes(self._line)))
        consumed = self._pending + first + 1
        self._line.clear()
        self._skipping = False
        # The complete lines after the first: searched for the prefix, the others never copied.
        last = data.rfind(b"\n")
        at = first
        while (at := data.find(b"\n" + PREFIX, at, last)) >= 0:
            end = data.find(b"\n", at + 1)
            line = data[at + 1 : end]
            too_long = len(line) > MAX_LINE_BYTES
            items.append(_rejected(line, TOO_LONG) if too_long else parse(line))
            at = end
        consumed += last - first
        self._take(data, last + 1, len(data), items)
        self._pending = len(data) - last - 1
        return Fed(items, consumed)

    def _take(
        self, data: bytes, start: int, end: int, items: list[LineReport | RejectedLine]
    ) -> None:
        """Keep data[start:end], the line in progress continued, while it may be a report."""
        if self._skipping:
            return
        line = self._line
        if len(line) < len(PREFIX):
            # The first bytes decide: most lines are not reports and are never copied further.
            head = min(end, start + len(PREFIX) - len(line))
            line += data[start:head]
            start = head
            if not PREFIX.startswith(line[: len(PREFIX)]):
                self._skip()
                return
        line += data[start : min(end, start + MAX_LINE_BYTES + 1 - len(line))]
        if len(line) > MAX_LINE_BYTES:
            items.append(_rejected(bytes(line), TOO_LONG))
            self._skip()

    def _skip(self) -> None:
        self._line.clear()
        self._skipping = True


def parse(line: bytes) -> LineReport | RejectedLine:
    """One complete line that starts with PREFIX (its newline removed), parsed."""
    try:
        value = json.loads(line[len(PREFIX) :].decode("utf-8", errors="replace"))
    except (ValueError, RecursionError) as error:
        return _rejected(line, f"not JSON: {error}")
    if not isinstance(value, dict):
        return _rejected(line, f"a JSON {type(value).__name__}, not an object")
    step = value.pop("step", None)
    if step is not None and (type(step) is not int or not 0 <= step <= MAX_STEP):
        return _rejected(line, f'"step" must be an integer from 0 to {MAX_STEP}')
    samples = value.pop("samples", None)
    if samples is not None:
        samples = _finite(samples)
        if samples is None or not 0 <= samples <= MAX_SAMPLES:
            return _rejected(line, f'"samples" must be a finite number from 0 to {MAX_SAMPLES:g}')
    pool_mb = value.pop("pool_mb", None)
    if pool_mb is not None and (type(pool_mb) is not int or not 0 <= pool_mb <= MAX_POOL_MB):
        return _rejected(line, f'"pool_mb" must be an integer from 0 to {MAX_POOL_MB}')
    if len(value) > MAX_METRICS:
        return _rejected(line, f"{len(value):,} metrics, over the limit of {MAX_METRICS}")
    for name in value:
        if (fault := _name_fault(name)) is not None:
            return _rejected(line, fault)
    metrics = {name: number for name, raw in value.items() if (number := _finite(raw)) is not None}
    return LineReport(step=step, samples=samples, metrics=metrics, pool_mb=pool_mb)


def _name_fault(name: str) -> str | None:
    """Why a metric's name is unfit to store, as a report's metric names are checked; None: fit."""
    if not name:
        return "a metric's name is empty"
    if len(name) > MAX_METRIC_CHARS:
        return f"a metric's name is over {MAX_METRIC_CHARS} characters"
    if "\0" in name:
        return "a metric's name holds a NUL character"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        # A JSON \ud800 escape without its pair: no text, and nothing could store or show it.
        return "a metric's name holds a lone surrogate (\\ud800-\\udfff without its pair)"
    return None


def _finite(value: object) -> float | None:
    """A JSON number as a finite float; None for anything else (bools, strings, NaN, 1e999)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _rejected(line: bytes, why: str) -> RejectedLine:
    """A rejection that shows the start of the line and the format it should have."""
    # Four bytes a character at most: enough of the line for the excerpt, never all 64 KiB.
    text = line[: EXCERPT_CHARS * 4 + 1].decode("utf-8", errors="replace").rstrip("\r")
    excerpt = text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "..."
    return RejectedLine(
        f"ignored a report line ({why}): {excerpt!r}; a report line is GPUMUX_REPORT and one "
        f"JSON object on one line, e.g. {EXAMPLE}"
    )
