"""Process identity from /proc: start ticks, group members, and killing a dead daemon's orphans."""

from __future__ import annotations

import signal
import subprocess
import sys

from gpumux.processes.procfs import (
    group_members,
    held,
    kill_marked,
    kill_orphans,
    send,
    start_ticks,
)


def test_a_group_id_reused_by_another_process_is_not_killed_as_leftovers() -> None:
    newcomer = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    try:
        ticks = start_ticks(newcomer.pid)
        assert ticks is not None
        assert group_members({newcomer.pid}) == {newcomer.pid: newcomer.pid}
        # A record of an older leader that had this pid as its group id.
        assert kill_orphans(pgid=newcomer.pid, started=ticks - 1) == []
        assert newcomer.poll() is None, "an unrelated process was killed"
        assert kill_orphans(pgid=newcomer.pid, started=ticks) == [newcomer.pid]
        assert newcomer.wait(timeout=10) == -signal.SIGKILL
    finally:
        newcomer.kill()
        newcomer.wait()


def test_processes_carrying_an_attempts_token_are_killed_and_no_others() -> None:
    marker = "GPUMUX_TRIAL_TOKEN=t0k3n"
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    marked = subprocess.Popen(sleep, env={"GPUMUX_TRIAL_TOKEN": "t0k3n"}, start_new_session=True)
    other = subprocess.Popen(sleep, env={"GPUMUX_TRIAL_TOKEN": "t0k3n0"}, start_new_session=True)
    try:
        ticks = start_ticks(marked.pid)
        assert ticks is not None
        # A process that started before the attempt is not its own, whatever it carries.
        assert kill_marked(marker.encode(), since=ticks + 1) == []
        assert kill_marked(marker.encode(), since=ticks) == [marked.pid]
        assert marked.wait(timeout=10) == -signal.SIGKILL
        assert other.poll() is None, "a process with another token was killed"
    finally:
        for process in (marked, other):
            process.kill()
            process.wait()


def test_a_process_held_before_it_is_reaped_is_never_signalled_under_a_reused_pid() -> None:
    # A pid read from /proc may name another process by the time it is signalled; a pidfd
    # names the process it was opened on, so a signal sent through it once that process is
    # reaped reaches no one, whichever process holds the pid now.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with held(child.pid) as pidfd:
        assert pidfd is not None
        assert send(pidfd, signal.SIGKILL)
        child.wait()
        assert not send(pidfd, signal.SIGKILL)


def test_a_trial_of_more_processes_than_the_supervisor_may_hold_open_is_signalled_whole() -> None:
    # Run as a supervisor would be: its children are the trial's processes, each in a group of
    # its own (escaped), more of them than the file descriptors it may open.
    code = """
import os, resource, signal
from gpumux.processes.reaping import HELD_AT_ONCE, signal_trial
count = HELD_AT_ONCE + 100
resource.setrlimit(resource.RLIMIT_NOFILE, (HELD_AT_ONCE + 50, HELD_AT_ONCE + 50))
children = []
for _ in range(count):
    pid = os.fork()
    if pid == 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1), os.dup2(devnull, 2)
        os.setpgid(0, 0)
        signal.pause()
        os._exit(0)
    children.append(pid)
try:
    escaped, refused = signal_trial(children[0], signal.SIGTERM)
finally:
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
ends = [os.waitpid(pid, 0)[1] for pid in children]
killed = sum(os.WIFSIGNALED(s) and os.WTERMSIG(s) == signal.SIGTERM for s in ends)
print(count, len(escaped), len(refused), killed)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    count, escaped, refused, killed = map(int, done.stdout.split())
    assert (refused, killed) == (0, count)
    assert escaped >= count - 1
