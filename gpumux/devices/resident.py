"""Resident memory of processes, read from /proc: what a trial holds on the CPU device."""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

MIB = 2**20


def resident_mb(pids: Collection[int], proc: Path = Path("/proc")) -> int | None:
    """The resident memory of these processes together, in MiB; None when none could be read.

    Pages that forked processes share count once per process: an upper bound, which is the
    safe side for a figure that says how much memory a trial needs.
    """
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    read = False
    for pid in pids:
        try:
            # statm: size resident shared text lib data dt, in pages; readable by anyone.
            fields = (proc / str(pid) / "statm").read_text().split()
        except OSError:
            # Ended between being listed and now.
            continue
        total += int(fields[1]) * page
        read = True
    return total // MIB if read else None
