"""The fork server of the hostile-argument cases (forkserver.py): what a case leaves running,
a case past its time, a server that misses a reply. Each case here is a module of the test's
own, run as `python -m` runs it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from builders import unmarked_environment
from forkserver import ForkServer, OutOfStep, StillRunning

# A case that leaves two processes running: a fork of itself (whose environment, as /proc
# shows it, is the server's: no test's mark) and a `sleep` it started; their pids in `pids`.
LEAVER = """
import os, subprocess, sys
forked = os.fork()
if forked == 0:
    os.closerange(0, 3)
    signal = __import__("signal")
    signal.pause()
    os._exit(0)
slept = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL)
with open("pids", "w") as pids:
    pids.write(f"{forked} {slept.pid}")
"""
# A case that starts a `sleep` (its pid in `pids`) and waits for it.
SLEEPER = """
import subprocess
slept = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL)
with open("pids", "w") as pids:
    pids.write(str(slept.pid))
slept.wait()
"""
# A case that prints its argument and exits with it.
ECHO = """
import sys
print(sys.argv[1])
sys.exit(int(sys.argv[1]))
"""


def start_server(tmp_path: Path, **options: float) -> ForkServer:
    """A fork server with the test modules in `tmp_path` and its cases' output below it."""
    for name, text in (("leaver", LEAVER), ("sleeper", SLEEPER), ("echo", ECHO)):
        (tmp_path / f"{name}.py").write_text(text)
    output = tmp_path / "output"
    output.mkdir()
    # Without the test's mark, as a module's server of test_hostile_args.py is: only the fork
    # server sees what a case forks.
    return ForkServer(output, env=unmarked_environment(), **options)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ForkServer]:
    # The server's own replies get the default time: on a loaded host, beside parallel
    # workers, a group's end and its leftovers' look took more than 10 s.
    started = start_server(tmp_path)
    yield started
    started.close()


def running(pid: int) -> bool:
    """Whether `pid` runs (not exited, waiting for its parent)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False


def ended_soon(pids: list[int]) -> bool:
    """Whether each of `pids` ends within 10 s."""
    deadline = time.monotonic() + 10
    while any(map(running, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(map(running, pids))


def test_what_a_case_leaves_running_is_killed_and_reported(
    tmp_path: Path, server: ForkServer
) -> None:
    ended = server.run([], env=dict(os.environ), cwd=tmp_path, timeout=60, module="leaver")
    assert ended.code == 0, ended.stderr
    pids = [int(pid) for pid in (tmp_path / "pids").read_text().split()]
    assert sorted(ended.left) == sorted(pids)
    assert "sleep 600" in ended.left[pids[1]]
    assert ended_soon(pids)


def test_a_case_past_its_time_is_killed_with_what_it_started(
    tmp_path: Path, server: ForkServer
) -> None:
    with pytest.raises(StillRunning) as raised:
        server.run([], env=dict(os.environ), cwd=tmp_path, timeout=2, module="sleeper")
    # Killed with the case, not left for the sweep after it.
    assert raised.value.left == {}
    assert ended_soon([int((tmp_path / "pids").read_text())])
    assert server.run(["4"], env=dict(os.environ), cwd=tmp_path, timeout=60, module="echo")[:2] == (
        4,
        b"4\n",
    )


def test_a_server_that_missed_a_reply_starts_afresh_rather_than_read_it_as_the_next(
    tmp_path: Path,
) -> None:
    # A short wait for the reply a stopped server cannot send.
    server = start_server(tmp_path, reply_timeout=5.0)
    try:
        stuck = server.process
        stuck.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(OutOfStep):
                server.run(["3"], env=dict(os.environ), cwd=tmp_path, timeout=60, module="echo")
        finally:
            stuck.send_signal(signal.SIGCONT)
        ended = server.run(["5"], env=dict(os.environ), cwd=tmp_path, timeout=60, module="echo")
        assert (ended.code, ended.stdout) == (5, b"5\n")
    finally:
        server.close()
