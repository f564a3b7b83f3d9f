"""What a trial's reports may cost the daemon: rows per second and per attempt.

Whatever a trial prints or posts, it adds at most GPUMUX_REPORT_BURST rows at once, then
GPUMUX_REPORT_RATE a second, and GPUMUX_REPORT_ROWS per attempt. A report of the step the
trial's latest row holds updates that row (its metrics' later values, its samples added) when
it comes within a second of that row or over the budget: a training loop that reports every
batch under one epoch keeps one row per epoch and second, each step's last value included. A
report of another step takes a row whatever the rate, until the attempt has GPUMUX_REPORT_ROWS
rows. Any other report over the budget is dropped and counted on the trial; its samples are
added to the latest row, so the samples the split search sums and the time of the last report
stay true.
"""

from __future__ import annotations

import enum
import logging
import math
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # Storage reads no settings of its own: the budget is given them by its owner.
    from gpumux.config import Settings

log = logging.getLogger(__name__)

# Reports of one step within this long of its row's creation share the row.
COALESCE_S = 1.0


class Verdict(enum.Enum):
    """What becomes of one report."""

    row = "a new row"
    merge = "merged into the latest row"
    drop = "dropped"


@dataclass
class Allowance:
    """One attempt's budget: tokens for new rows (`burst` at most, `rate` a second), rows kept
    (`rows` of `limit`), and its latest row (`latest`: its id, None until it is flushed; none
    at all while `has_latest` is false), on a monotonic clock."""

    rate: float
    burst: int
    limit: int
    tokens: float
    at: float
    rows: int = 0
    latest: int | None = None
    has_latest: bool = False
    latest_step: int | None = None
    latest_made: float = -math.inf
    warned: bool = False

    def decide(self, step: int | None, now: float) -> Verdict:
        """Whether a report of `step` at `now` takes a new row (spending a token, and counted
        as the latest from now on), merges into the latest, or is dropped."""
        self.tokens = min(float(self.burst), self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = now
        same = self.has_latest and step == self.latest_step
        if same and now - self.latest_made < COALESCE_S:
            return Verdict.merge
        # A step of its own keeps its last value whatever the rate, within the rows per
        # attempt: a pruner judges each step, and the split search reads the latest.
        new_step = step is not None and not same
        if self.rows < self.limit and (self.tokens >= 1.0 or new_step):
            self.tokens = max(0.0, self.tokens - 1.0)
            self.take(step, now)
            return Verdict.row
        return Verdict.merge if same else Verdict.drop

    def take(self, step: int | None, now: float) -> None:
        """A new row of `step` is stored, the latest from now on (its id once flushed)."""
        self.rows += 1
        self.latest, self.has_latest = None, True
        self.latest_step, self.latest_made = step, now


# What the database holds of an attempt's reports: how many rows, and its latest row's id and
# step (None: none).
Seed = tuple[int, int | None, int | None]


class ReportBudget:
    """Every trial attempt's allowance, shared by the API's report route and the scheduler's
    report lines (each decision is taken under a lock; the row is written in the caller's
    transaction, and write transactions are serialised)."""

    def __init__(
        self,
        *,
        rate: float,
        burst: int,
        rows: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate, self.burst, self.rows = rate, burst, rows
        self.clock = clock
        self._lock = threading.Lock()
        self._allowances: dict[tuple[int, int], Allowance] = {}

    @classmethod
    def of(cls, settings: Settings) -> ReportBudget:
        """The budget the settings give every trial (GPUMUX_REPORT_*)."""
        return cls(
            rate=settings.report_rate, burst=settings.report_burst, rows=settings.report_rows
        )

    def allowance(self, trial_id: int, attempt: int, seed: Callable[[], Seed]) -> Allowance:
        """The attempt's allowance; the first time, counted from what `seed` says is stored
        (a restarted daemon keeps the attempt's total) with a full burst."""
        key = (trial_id, attempt)
        with self._lock:
            allowance = self._allowances.get(key)
        if allowance is not None:
            return allowance
        rows, latest, latest_step = seed()
        fresh = Allowance(
            rate=self.rate,
            burst=self.burst,
            limit=self.rows,
            tokens=float(self.burst),
            at=self.clock(),
            rows=rows,
            latest=latest,
            has_latest=latest is not None,
            latest_step=latest_step,
        )
        with self._lock:
            # Drop earlier attempts' allowances: they report no more. (A late report of an earlier
            # attempt leaves a later one's alone; the later one's end drops it.)
            for old in [k for k in self._allowances if k[0] == trial_id and k[1] < attempt]:
                del self._allowances[old]
            return self._allowances.setdefault(key, fresh)

    def decide(self, allowance: Allowance, step: int | None) -> Verdict:
        with self._lock:
            return allowance.decide(step, self.clock())

    def take(self, allowance: Allowance, step: int | None) -> None:
        """A new row of `step` is stored whatever the budget (the latest row is gone: its
        transaction rolled back)."""
        with self._lock:
            allowance.take(step, self.clock())

    def settle(self, allowance: Allowance, row_id: int) -> None:
        """The latest row was flushed: its id."""
        with self._lock:
            allowance.latest = row_id

    def first_drop(self, allowance: Allowance) -> bool:
        """Whether this is the attempt's first drop (to be said once)."""
        with self._lock:
            first, allowance.warned = not allowance.warned, True
        return first

    def end(self, attempts: Collection[tuple[int, int]]) -> None:
        """These (trial id, attempt) ended: their allowances go, and any of an earlier attempt
        of the same trial (one a late report made again after its own end), so that a daemon
        that runs trials for months holds only its running attempts' allowances; a later
        attempt of the same trial keeps its own, whenever this end comes."""
        ended: dict[int, int] = {}
        for trial_id, attempt in attempts:
            ended[trial_id] = max(attempt, ended.get(trial_id, attempt))
        with self._lock:
            for key in [k for k in self._allowances if k[1] <= ended.get(k[0], 0)]:
                del self._allowances[key]

    def __len__(self) -> int:
        """How many attempts' allowances are held."""
        with self._lock:
            return len(self._allowances)

    def forget(self) -> None:
        """Count every attempt again from the database (after a failed write)."""
        with self._lock:
            self._allowances.clear()
