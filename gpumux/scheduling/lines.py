"""Report lines: what running trials print as `GPUMUX_REPORT {...}`, read from their logs.

A script that imports nothing reports by printing a line; its supervisor writes the line to the
trial's log like any other output. Each tick, this reads what every running trial's current
attempt added to its log since the last look (following rotations by whole-output offset), in
one slice of at most READ_LIMIT bytes per trial, parses it (`processes/reportlines.py`) and
records the reports as the API records a report, within the trial's budget
(`storage/budget.py`), in one short transaction. A line says no interval: the samples of a
read's lines are spread over the time since the last read that found lines of the attempt (at
first, since the attempt started), which gives the trial its samples/s. A flood is read a
slice a tick: it neither starves the other trials nor makes a transaction long. The offset read
up to is stored with the trial, so a restarted daemon reads on rather than again.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime

from gpumux.processes.logfiles import read_log
from gpumux.processes.reportlines import LineReport, ReportLines
from gpumux.storage import reports as report_store
from gpumux.storage import trials as trial_store
from gpumux.storage.budget import ReportBudget
from gpumux.storage.engine import Sessions
from gpumux.storage.models import utcnow
from gpumux.storage.nodes import ThisNode
from gpumux.storage.reports import Incoming

log = logging.getLogger(__name__)

# At most this much of one trial's output is read in one pass; the rest at the next. A MiB of
# report lines (about 17,000) parses in a fraction of a second and stores a few rows.
READ_LIMIT = 1024 * 1024


@dataclass
class _Batch:
    """Consecutive report lines of one step, merged: samples summed, each metric's last value."""

    step: int | None
    samples: float | None
    metrics: dict[str, float]
    pool_mb: int | None
    # The earliest its lines can have been printed (None: the trial's start).
    printed_after: datetime | None
    lines: int = 1


@dataclass
class _Reader:
    """Where one attempt's log has been read to (the start of the line in progress)."""

    offset: int
    lines: ReportLines = field(default_factory=ReportLines)
    # When a read last found report lines: their samples were done since then.
    last_at: datetime | None = None
    # When the last read that reached the log's end began: every line found later was printed
    # after it (a line already there would have been read).
    whole_at: datetime | None = None


class LogReports:
    """Reads the report lines of the running trials from their logs and records them."""

    def __init__(
        self, *, sessions: Sessions, budget: ReportBudget, here: ThisNode | None = None
    ) -> None:
        self.sessions = sessions
        self.budget = budget
        # This node's trials only: another node's logs are on its own disk.
        self.here = here or ThisNode()
        # One reader per (trial, attempt), from the offset stored with the trial.
        self._readers: dict[tuple[int, int], _Reader] = {}
        self._warned: set[tuple[int, int]] = set()
        # Whether the last pass over every trial left a log unread past its slice.
        self.behind = False
        # Attempts (trial id, attempt) whose supervisors exited, and the size of their logs
        # then (None: not seen).
        self._ended: dict[tuple[int, int], int | None] = {}

    def collect(self, *, only: Collection[int] | None = None) -> set[tuple[int, int]]:
        """Record the report lines running trials (those of `only`, if given) printed since the
        last look, one slice of each log; the attempts (trial id, attempt) marked `ended` whose
        logs are now read to where they ended (or that have no log left to read)."""
        with self.sessions.read() as session:
            targets = [
                (trial.id, trial.attempt, trial.log_path, trial.log_scanned)
                for trial in trial_store.active_trials(session=session, node_id=self.here.id)
                if trial.log_path is not None and (only is None or trial.id in only)
            ]
        live = {(trial_id, attempt) for trial_id, attempt, _, _ in targets}
        if only is None:
            for gone in set(self._readers) - live:
                del self._readers[gone]
            self._warned &= live
        found: dict[tuple[int, int], tuple[int, list[_Batch]]] = {}
        asked = {key for key in self._ended if only is None or key[0] in only}
        # An attempt the database no longer lists as running here has nothing left to record.
        whole = asked - live
        behind = False
        for trial_id, attempt, path, scanned in targets:
            key = (trial_id, attempt)
            reader = self._readers.setdefault(key, _Reader(scanned))
            if key in self._ended and self._ended[key] is None:
                # Its supervisor has exited: what the log holds now is all the trial wrote.
                self._ended[key] = read_log(path, None, 0)[2]
            batches, at_end = self._read(trial_id, attempt, path, reader)
            end = self._ended.get(key)
            if end is not None and (at_end or reader.offset + reader.lines.pending >= end):
                whole.add(key)
            behind |= not at_end
            if batches:
                found[key] = (reader.offset, batches)
        if only is None:
            self.behind = behind
        if found:
            self._record(found)
        for key in whole:
            self._ended.pop(key, None)
        # Only the attempts that ended: a retry's allowance is its own.
        self.budget.end(whole)
        return whole

    def ended(self, attempts: Iterable[tuple[int, int]]) -> None:
        """These attempts' (trial id, attempt) supervisors exited: `collect` says when their
        logs are read to the end they had then (a process left behind may write on; it is not
        waited for)."""
        for key in attempts:
            self._ended.setdefault(key, None)

    def drain(self, attempts: Collection[tuple[int, int]]) -> None:
        """Read these ended attempts' logs to their end, a slice and a short transaction at a
        time (at a start, before their ends are recorded: the last lines count)."""
        self.ended(attempts)
        left = set(attempts)
        while left:
            left -= self.collect(only={trial_id for trial_id, _ in left})

    def forget(self) -> None:
        """Drop what was read (after a failed write): read again from the stored offsets."""
        self._readers.clear()
        self._ended = dict.fromkeys(self._ended)
        self.budget.forget()

    def _read(
        self, trial_id: int, attempt: int, path: str, reader: _Reader
    ) -> tuple[list[_Batch], bool]:
        """The reports in one slice of what the log holds past the reader's offset, consecutive
        lines of one step merged; and whether the slice reached the log's end."""
        printed_after, began = reader.whole_at, utcnow()
        data, start, _, skipped = read_log(path, reader.offset + reader.lines.pending, READ_LIMIT)
        if len(data) < READ_LIMIT:
            reader.whole_at = began
        if skipped:
            # Rotation dropped output nobody read: go on from the oldest piece kept.
            log.warning("trial %s: %d bytes of its log rotated away unread", trial_id, skipped)
            reader.lines = ReportLines()
            reader.offset = start
        batches: list[_Batch] = []
        if not data:
            return batches, True
        fed = reader.lines.feed(data)
        reader.offset += fed.consumed
        for item in fed.items:
            if isinstance(item, LineReport):
                last = batches[-1] if batches else None
                if last is not None and last.step == item.step:
                    last.lines += 1
                    last.metrics.update(item.metrics)
                    if item.samples is not None:
                        last.samples = (last.samples or 0.0) + item.samples
                    if item.pool_mb is not None:
                        last.pool_mb = item.pool_mb
                else:
                    batches.append(
                        _Batch(
                            item.step, item.samples, dict(item.metrics), item.pool_mb, printed_after
                        )
                    )
            elif (trial_id, attempt) not in self._warned:
                self._warned.add((trial_id, attempt))
                log.warning("trial %s: %s", trial_id, item.reason)
        return batches, len(data) < READ_LIMIT

    def _record(self, found: dict[tuple[int, int], tuple[int, list[_Batch]]]) -> None:
        """Store the reports, and the offset read to with them: output between holds none, so
        a restarted daemon that reads it again finds nothing twice."""
        with self.sessions.write.begin() as session:
            for (trial_id, attempt), (scanned, batches) in found.items():
                trial = trial_store.get_trial(session=session, trial_id=trial_id)
                if trial is None:
                    continue
                if trial_store.still_held(trial, node_id=self.here.id, attempt=attempt) is not None:
                    continue
                now = utcnow()
                reader = self._readers.get((trial_id, attempt))
                last = reader.last_at if reader is not None else None
                # A new reader (a daemon restarted) goes on from the last report recorded.
                since = last or trial.last_report_at or trial.started_at
                if reader is not None:
                    reader.last_at = now
                report_store.add_line_reports(
                    session=session,
                    trial=trial,
                    reports=_timed(batches, now, since, started=trial.started_at),
                    budget=self.budget,
                    read_to=scanned,
                )


def _timed(
    batches: list[_Batch], now: datetime, since: datetime | None, *, started: datetime | None
) -> list[Incoming]:
    """The batches as reports, the interval since the read before (`since`) shared by their
    samples: each report's samples/s is the read's (lines read together say nothing of their
    own spacing). A pool a line told is taken as read at the earliest its line can have been
    printed (else at the trial's start), the side a measured context may rely on."""
    total = sum(b.samples or 0.0 for b in batches)
    seconds = (now - since).total_seconds() if since is not None else 0.0
    return [
        Incoming(
            step=b.step,
            samples=b.samples,
            metrics=b.metrics,
            count=b.lines,
            pool_mb=b.pool_mb,
            pool_at=(b.printed_after or started) if b.pool_mb is not None else None,
            seconds=seconds * b.samples / total if b.samples and total and seconds > 0 else None,
        )
        for b in batches
    ]
