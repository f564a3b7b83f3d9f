"""The devices as last probed, and which of the processes they list are our trials'.

NVML is asked at most every poll interval; between two probes trials are placed on the last
snapshot, whose process list may name processes that have ended since. Our trials' processes
are found by a scan of /proc: their process groups, and what left them below their supervisors.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from gpumux.devices.probes import DeviceProbe, NvmlUnavailable
from gpumux.devices.snapshot import DeviceSnapshot
from gpumux.processes.procfs import group_members
from gpumux.scheduling.watched import Watched

log = logging.getLogger(__name__)


class ProbedDevices:
    """This node's devices, probed again once the last snapshot is a poll interval old, and our
    trials' processes among those that snapshot lists."""

    def __init__(self, *, probe: DeviceProbe, poll_interval: float, watched: Watched) -> None:
        self.probe = probe
        self.poll_interval = poll_interval
        self.watched = watched
        self.devices: list[DeviceSnapshot] = []
        self._probed_at = float("-inf")
        # Our trials' processes as the last snapshot may list them: those the last scan before
        # that probe found, and every one a scan found since. One that ended since the probe (a
        # trial reaped since, a worker that exited before the scan) is still listed in that
        # snapshot, and counted as another's it would shrink the next trial's slice by its
        # memory (a slice at the edge then runs out of memory).
        self._ours_since_probe: dict[int, int] = {}
        # What the last scan of /proc found.
        self._scanned: dict[int, int] = {}

    def snapshot(self) -> list[DeviceSnapshot]:
        """The devices as last probed, probed again when that is a poll interval old."""
        now = time.monotonic()
        if now - self._probed_at >= self.poll_interval:
            self._probed_at = now
            self._ours_since_probe = dict(self._scanned)
            try:
                self.devices = self.probe.snapshot()
            except NvmlUnavailable as error:
                # Keep the last snapshot: trials on it run on; nothing new is placed blindly.
                log.error("devices: NVML failed (%s); placing nothing until it answers", error)
                self.devices = [replace(d, error=str(error)) for d in self.devices]
        return self.devices

    def expire(self) -> None:
        """Probe again at the next look (the last probe failed)."""
        self._probed_at = float("-inf")

    def trial_processes(self) -> dict[int, int]:
        """Our trials' processes, each mapped to its trial's process group: every process a scan
        of /proc finds in a watched group or below its supervisor, and each group's leader even
        where it exited between the probe and the scan (the snapshot still lists it, and counted
        as another's its memory would shrink the next trial's slice)."""
        pgids = self.watched.pgids()
        leaders = {pgid: pgid for pgid in pgids}
        self._scanned = leaders | group_members(pgids, subreapers=self.watched.subreapers())
        return dict(self._scanned)

    def ours_since_probe(self) -> dict[int, int]:
        """Our trials' processes as the last snapshot may list them: every process the last scan
        before that probe found ours, and every one a scan found since, this look's included."""
        self._ours_since_probe.update(self.trial_processes())
        return dict(self._ours_since_probe)
