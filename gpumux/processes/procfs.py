"""Process identity from /proc: a pid with its start ticks names one process, even after reuse;
and the processes of a trial, in its process group or escaped from it.

A pid read from /proc may be freed and given to another process before it is signalled. So a
process is held by a pidfd (Linux 5.3) before what /proc says of it is checked, and signalled
through that pidfd: if the pid was reused before the pidfd was opened, the check reads the new
process; if after, the signal reaches no one.

The supervisor imports this module (for start_ticks and descendants): standard library only,
and little of it.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Collection, Iterator, Mapping


def start_ticks(pid: int, *, living: bool = False) -> int | None:
    """When the process started, in clock ticks since boot: with the pid, an identity.

    With `living`, None for a zombie too: it has exited, and only waits to be collected.
    """
    fields = _stat(pid)
    if fields is None:
        return None
    if living and fields[0] == "Z":
        return None
    return int(fields[19])


@contextlib.contextmanager
def held(pid: int) -> Iterator[int | None]:
    """A pidfd for the process `pid` names now; None when it is gone."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def send(pidfd: int, signum: int) -> bool:
    """Signal the process held by `pidfd`; whether it was still there to signal."""
    try:
        signal.pidfd_send_signal(pidfd, signum)
    except ProcessLookupError:
        return False
    return True


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat from the state on (field 3), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            stat = stat_file.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    return stat.rpartition(")")[2].split()


def _processes() -> dict[int, list[str]]:
    """Every process's stat fields (from the state on), by pid: one scan of /proc."""
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (fields := _stat(entry.name)) is not None:
            found[int(entry.name)] = fields
    return found


def _under(parents: Mapping[int, int], roots: Collection[int]) -> dict[int, int]:
    """Each process below one of `roots` (its parent, or its parent's parent and so on, is the
    root), mapped to that root; the roots themselves are not."""
    root_of: dict[int, int] = {}
    outside: set[int] = set()
    for pid in parents:
        chain: list[int] = []
        ancestor = pid
        # The walk stops at init (pid 1, or 0 above it), at a process gone, at one already
        # placed, or at a loop that a pid reused between two reads could make.
        while (
            ancestor in parents
            and ancestor not in roots
            and ancestor not in root_of
            and ancestor not in outside
            and len(chain) < len(parents)
        ):
            chain.append(ancestor)
            ancestor = parents[ancestor]
        root = ancestor if ancestor in roots else root_of.get(ancestor)
        if root is None:
            outside.update(chain)
        else:
            root_of.update(dict.fromkeys(chain, root))
    return root_of


def descendants(root: int) -> set[int]:
    """The living processes whose parent, or whose parent's parent and so on, is `root`.

    Run by a child subreaper (the supervisor), this is every process its trial started, in the
    trial's process group or not: what a double fork orphans is reparented to the subreaper,
    not to init. Zombies are left out: they have exited.
    """
    parents = {pid: int(f[1]) for pid, f in _processes().items() if f[0] != "Z"}
    return set(_under(parents, {root}))


def kill_marked(marker: bytes, *, since: int) -> list[int]:
    """SIGKILL every process started no earlier than `since` (start ticks) whose environment
    holds `marker` (a whole `NAME=value` entry); the pids killed.

    What is left of a trial whose supervisor was killed: processes that left its group are no
    one's children any more, but they inherited the attempt's environment (its own report
    token). A process that replaced its environment at an exec is not found.
    """
    killed = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        with held(pid) as pidfd:
            if pidfd is None:
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as environ:
                    marked = marker in environ.read().split(b"\0")
            except OSError:
                continue
            ticks = start_ticks(pid, living=True)
            if marked and ticks is not None and ticks >= since and send(pidfd, signal.SIGKILL):
                killed.append(pid)
    return killed


def group_members(
    pgids: Collection[int], *, subreapers: Mapping[int, int] | None = None
) -> dict[int, int]:
    """Every live process in one of these process groups, mapped to its group; with
    `subreapers` (a trial's supervisor's pid -> the trial's group), also every process below
    such a supervisor, mapped to its trial's group: those that left the group count as the
    trial's (its GPU memory, say)."""
    wanted = set(pgids)
    processes = _processes()
    members = {pid: int(f[2]) for pid, f in processes.items() if int(f[2]) in wanted}
    if subreapers:
        parents = {pid: int(f[1]) for pid, f in processes.items()}
        below = _under(parents, subreapers.keys())
        for pid, supervisor in below.items():
            members.setdefault(pid, subreapers[supervisor])
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
        with held(pid) as pidfd:
            ticks = None if pidfd is None else start_ticks(pid)
            if pidfd is not None and ticks is not None and ticks >= started:
                if send(pidfd, signal.SIGKILL):
                    killed.append(pid)
    return killed
