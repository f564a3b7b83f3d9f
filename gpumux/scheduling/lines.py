"""Report lines: what running trials print as `GPUMUX_REPORT {...}`, read from their logs.

A script that imports nothing reports by printing a line; its supervisor writes the line to the
trial's log like any other output. Each tick, this reads what every running trial's current
attempt added to its log since the last look (following rotations by whole-output offset),
parses it (`processes/reportlines.py`) and records the reports as the API records a report. The
offset read up to is stored with the trial, so a restarted daemon reads on rather than again.
"""

from __future__ import annotations

import logging

from gpumux.processes.logfiles import read_log
from gpumux.processes.reportlines import LineReport, ReportLines
from gpumux.status import ACTIVE_TRIAL_STATUSES
from gpumux.storage import reports as report_store
from gpumux.storage import store
from gpumux.storage.engine import Sessions

log = logging.getLogger(__name__)

# At most this much of one trial's output is read in one tick; the rest at the next.
READ_LIMIT = 1024 * 1024


class LogReports:
    """Reads the report lines of the running trials from their logs and records them."""

    def __init__(self, *, sessions: Sessions) -> None:
        self.sessions = sessions
        # One parser per (trial, attempt): it holds the line in progress between looks.
        self._parsers: dict[tuple[int, int], ReportLines] = {}
        self._warned: set[tuple[int, int]] = set()

    def collect(self) -> int:
        """Record the report lines running trials printed since the last look; how many."""
        with self.sessions.read() as session:
            targets = [
                (trial.id, trial.attempt, trial.log_path, trial.log_scanned)
                for trial in store.active_trials(session=session)
                if trial.log_path is not None
            ]
        live = {(trial_id, attempt) for trial_id, attempt, _, _ in targets}
        for gone in set(self._parsers) - live:
            del self._parsers[gone]
        self._warned &= live
        read: dict[tuple[int, int], tuple[int, list[LineReport]]] = {}
        for trial_id, attempt, path, scanned in targets:
            found = self._read(trial_id, attempt, path, scanned)
            if found is not None:
                read[(trial_id, attempt)] = found
        if not read:
            return 0
        return self._record(read)

    def _read(
        self, trial_id: int, attempt: int, path: str, scanned: int
    ) -> tuple[int, list[LineReport]] | None:
        """The offset read up to and the reports found past `scanned`; None when nothing new."""
        parser = self._parsers.setdefault((trial_id, attempt), ReportLines())
        data, start, _, skipped = read_log(path, scanned + parser.pending, READ_LIMIT)
        if skipped:
            # Rotation dropped output nobody read: go on from the oldest piece kept.
            log.warning("trial %s: %d bytes of its log rotated away unread", trial_id, skipped)
            parser = self._parsers[(trial_id, attempt)] = ReportLines()
            scanned = start
        if not data:
            return None
        fed = parser.feed(data)
        reports = []
        for item in fed.items:
            if isinstance(item, LineReport):
                reports.append(item)
            elif (trial_id, attempt) not in self._warned:
                self._warned.add((trial_id, attempt))
                log.warning("trial %s: %s", trial_id, item.reason)
        if not fed.consumed and not skipped:
            return None
        return scanned + fed.consumed, reports

    def _record(self, read: dict[tuple[int, int], tuple[int, list[LineReport]]]) -> int:
        recorded = 0
        with self.sessions.write.begin() as session:
            for (trial_id, attempt), (scanned, reports) in read.items():
                trial = store.get_trial(session=session, trial_id=trial_id)
                if trial is None or trial.attempt != attempt:
                    continue
                if trial.status not in ACTIVE_TRIAL_STATUSES:
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
