"""A trial's processes from its supervisor's side: every process the trial started, in its
process group or not, signalled and collected.

The supervisor is a child subreaper (prctl PR_SET_CHILD_SUBREAPER, Linux 3.4): a process the
trial double-forks after a setsid() is reparented to it instead of to init, so its descendants
are the trial's processes, wherever they moved. Standard library only (the supervisor imports
it); ctypes costs some 5 ms to import, paid once by the spawner that forks supervisors, and
by a supervisor started afresh only when there is no spawner.
"""

from __future__ import annotations

import contextlib
import ctypes
import os

from gpumux.processes.procfs import descendants, held, send

# prctl(2): orphans among this process's descendants are reparented to it, not to init.
PR_SET_CHILD_SUBREAPER = 36
# How many of the trial's processes `signal_trial` holds a pidfd for at once.
HELD_AT_ONCE = 256


def become_subreaper() -> str | None:
    """Make this process a child subreaper; None, or why it could not (its trial's processes
    that leave the trial's group then outlive it)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
            return None
        return os.strerror(ctypes.get_errno())
    except (OSError, AttributeError) as error:
        return str(error)


def signal_trial(pgid: int, signum: int) -> tuple[set[int], set[int]]:
    """Send `signum` to the trial's process group and to each of this process's descendants
    outside it, once each (a second SIGTERM may mean "now" to a trial's handler). Returns the
    pids outside the group signalled, and those that refused it: a set-user-ID program (sudo)
    that a supervisor not run as root may not signal."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)
    escaped: set[int] = set()
    refused: set[int] = set()
    found = sorted(descendants(os.getpid()))
    # A few hundred held at once: a trial of thousands of processes must not run the
    # supervisor out of file descriptors while it stops them.
    for start in range(0, len(found), HELD_AT_ONCE):
        with contextlib.ExitStack() as stack:
            # Held first, then found among the descendants again: a pid reused by a process
            # that is not the trial's between the first scan and its pidfd is not in the second.
            pidfds = {
                pid: stack.enter_context(held(pid)) for pid in found[start : start + HELD_AT_ONCE]
            }
            for pid in descendants(os.getpid()) & pidfds.keys():
                pidfd = pidfds[pid]
                try:
                    if pidfd is not None and os.getpgid(pid) != pgid and send(pidfd, signum):
                        escaped.add(pid)
                except ProcessLookupError:
                    continue
                except PermissionError:
                    refused.add(pid)
    return escaped, refused


def reap_orphans(*, leader: int | None) -> None:
    """Collect this process's exited children, but not `leader` (None: every one): the trial's
    leader is reaped for its exit status, and its unreaped pid pins the group id until then."""
    while True:
        try:
            found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if found is None or found.si_pid == leader:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(found.si_pid, 0)
