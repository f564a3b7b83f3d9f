"""Report lines: what running trials print as `GPUMUX_REPORT {...}`, read from their logs.

A script that imports nothing reports by printing a line; its supervisor writes the line to the
trial's log like any other output. Each tick, this reads what every running trial's current
attempt added to its log since the last look (following rotations by whole-output offset),
parses it (`processes/reportlines.py`) and records the reports as the API records a report. The
offset read up to is stored with the trial, so a restarted daemon reads on rather than again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from gpumux.processes.logfiles import read_log
from gpumux.processes.reportlines import LineReport, ReportLines
from gpumux.storage import reports as report_store
from gpumux.storage import store
from gpumux.storage.engine import Sessions

log = logging.getLogger(__name__)

# At most this much of one trial's output is read in one tick; the rest at the next.
READ_LIMIT = 1024 * 1024


@dataclass
class _Reader:
    """Where one attempt's log has been read to (the start of the line in progress)."""

    offset: int
    lines: ReportLines = field(default_factory=ReportLines)


class LogReports:
    """Reads the report lines of the running trials from their logs and records them."""

    def __init__(self, *, sessions: Sessions, node_id: int | None = None) -> None:
        self.sessions = sessions
        # This node's trials only: another node's logs are on its own disk.
        self.node_id = node_id
        # One reader per (trial, attempt), from the offset stored with the trial.
        self._readers: dict[tuple[int, int], _Reader] = {}
        self._warned: set[tuple[int, int]] = set()

    def collect(self, *, drain: bool = False) -> int:
        """Record the report lines running trials printed since the last look; how many. With
        `drain`, read each log to its end (before an end is recorded: its last lines count)."""
        with self.sessions.read() as session:
            targets = [
                (trial.id, trial.attempt, trial.log_path, trial.log_scanned)
                for trial in store.active_trials(session=session, node_id=self.node_id)
                if trial.log_path is not None
            ]
        live = {(trial_id, attempt) for trial_id, attempt, _, _ in targets}
        for gone in set(self._readers) - live:
            del self._readers[gone]
        self._warned &= live
        found: dict[tuple[int, int], tuple[int, list[LineReport]]] = {}
        for trial_id, attempt, path, scanned in targets:
            reader = self._readers.setdefault((trial_id, attempt), _Reader(scanned))
            reports = self._read(trial_id, attempt, path, reader, drain=drain)
            if reports:
                found[(trial_id, attempt)] = (reader.offset, reports)
        if not found:
            return 0
        return self._record(found)

    def forget(self) -> None:
        """Drop what was read (after a failed write): read again from the stored offsets."""
        self._readers.clear()

    def _read(
        self, trial_id: int, attempt: int, path: str, reader: _Reader, *, drain: bool
    ) -> list[LineReport]:
        """The reports in what the log holds past the reader's offset (one chunk, or all)."""
        reports: list[LineReport] = []
        while True:
            data, start, _, skipped = read_log(
                path, reader.offset + reader.lines.pending, READ_LIMIT
            )
            if skipped:
                # Rotation dropped output nobody read: go on from the oldest piece kept.
                log.warning("trial %s: %d bytes of its log rotated away unread", trial_id, skipped)
                reader.lines = ReportLines()
                reader.offset = start
            if not data:
                return reports
            fed = reader.lines.feed(data)
            reader.offset += fed.consumed
            for item in fed.items:
                if isinstance(item, LineReport):
                    reports.append(item)
                elif (trial_id, attempt) not in self._warned:
                    self._warned.add((trial_id, attempt))
                    log.warning("trial %s: %s", trial_id, item.reason)
            if not drain:
                return reports

    def _record(self, found: dict[tuple[int, int], tuple[int, list[LineReport]]]) -> int:
        """Store the reports, and the offset read to with them: output between holds none, so
        a restarted daemon that reads it again finds nothing twice."""
        recorded = 0
        with self.sessions.write.begin() as session:
            for (trial_id, attempt), (scanned, reports) in found.items():
                trial = store.get_trial(session=session, trial_id=trial_id)
                if trial is None:
                    continue
                if store.still_held(trial, node_id=self.node_id, attempt=attempt) is not None:
                    continue
                for report in reports:
                    report_store.add_line_report(
                        session=session,
                        trial=trial,
                        step=report.step,
                        samples=report.samples,
                        metrics=report.metrics,
                    )
                recorded += len(reports)
                trial.log_scanned = scanned
        return recorded
