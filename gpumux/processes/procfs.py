"""Process identity from /proc: a pid with its start ticks names one process, even after reuse.

The supervisor imports this module (for start_ticks): standard library only, and little of it.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Collection


def start_ticks(pid: int, *, living: bool = False) -> int | None:
    """When the process started, in clock ticks since boot: with the pid, an identity.

    With `living`, None for a zombie too: it has exited, and only waits to be collected.
    """
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            stat = stat_file.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat.rpartition(")")[2].split()
    if living and fields[0] == "Z":
        return None
    return int(fields[19])


def group_members(pgids: Collection[int]) -> dict[int, int]:
    """Every live process in one of these process groups, mapped to its group."""
    members = {}
    wanted = set(pgids)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError):
            group = os.getpgid(int(entry.name))
            if group in wanted:
                members[int(entry.name)] = group
    return members


def kill_orphans(*, pgid: int, started: int) -> list[int]:
    """SIGKILL what is left of a trial's process group after its daemon died; the pids killed.

    The leader may be gone while its children (data loaders, say) still hold the GPU. A member
    counts as the trial's only if it started no earlier than the leader, and none is killed
    when the leader's pid now names another process: the group id was freed and reused (while
    any member lives, the id stays taken, so members of a dead leader's group are its own).
    """
    leader_ticks = start_ticks(pgid)
    if leader_ticks is not None and leader_ticks != started:
        return []
    killed = []
    for pid in group_members({pgid}):
        ticks = start_ticks(pid)
        if ticks is not None and ticks >= started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed
