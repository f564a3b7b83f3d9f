"""No trial outlives its stop: a grandchild that left the trial's process group and session
(fork, setsid, fork: what a daemonising library does) is stopped with the trial, by a cancel, a
time limit, a restart or a kill -9 of the daemon, and a kill -9 of its supervisor; and the
trial's end is recorded only once it is gone."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import DaemonFactory, DaemonProcess
from .test_restart import FAST_KILL, FIXTURES, alive, assert_no_orphans, wait_until

ESCAPER = FIXTURES / "escaper.py"
ENDED = {"succeeded", "failed", "cancelled", "lost", "pruned"}


def start_escaper(
    daemon: DaemonProcess, folder: Path, *flags: str, **fields: Any
) -> tuple[int, int, int]:
    """A one-trial sweep of escaper.py: its id, the trial's leader and its escaped grandchild,
    once that runs."""
    pidfile = folder / "pids"
    body = {
        "params": ["x=0"],
        "command": [sys.executable, str(ESCAPER), str(pidfile), *flags],
        "workdir": str(folder),
        "env": {"PATH": os.environ["PATH"]},
        "split": 1,
        **fields,
    }
    with daemon.client() as client:
        created = client.post("/sweeps", json=body)
    assert created.status_code == 201, created.text
    leader, grandchild = wait_until(
        daemon,
        "the trial to start its escaped grandchild",
        lambda: [int(pid) for pid in pidfile.read_text().split()] if pidfile.exists() else None,
    )
    # The trial leads a session of its own (its sid is its pid). With --exit the trial may be
    # over and its grandchild killed already: the other tests check the fixture then.
    with contextlib.suppress(ProcessLookupError):
        assert os.getsid(grandchild) != leader, "the fixture did not leave the session"
    sweep_id: int = created.json()["id"]
    return sweep_id, leader, grandchild


def ended_trial(daemon: DaemonProcess, sweep_id: int) -> dict[str, Any]:
    """The sweep's one trial, once its end is recorded."""

    def ended() -> dict[str, Any] | None:
        with daemon.client() as client:
            rows: list[dict[str, Any]] = client.get(f"/sweeps/{sweep_id}/trials").json()["data"]
        return rows[0] if rows[0]["status"] in ENDED else None

    return wait_until(daemon, f"the trial of sweep {sweep_id} to end", ended)


def cancel(daemon: DaemonProcess, sweep_id: int) -> None:
    with daemon.client() as client:
        assert client.post(f"/sweeps/{sweep_id}/cancel").status_code == 202


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def test_a_cancel_stops_the_grandchild_before_the_trial_is_recorded_cancelled(
    make_daemon: DaemonFactory, tmp_path: Path
) -> None:
    daemon = make_daemon(env=FAST_KILL)
    sweep_id, leader, grandchild = start_escaper(daemon, tmp_path, "--ignore-term")

    cancel(daemon, sweep_id)
    trial = ended_trial(daemon, sweep_id)

    assert trial["status"] == "cancelled", trial
    # Its end is recorded only once none of its processes runs.
    assert not alive(leader) and not alive(grandchild), (leader, grandchild)
    assert_no_orphans(daemon)


def test_a_trial_that_ends_leaves_no_daemonised_grandchild(
    make_daemon: DaemonFactory, tmp_path: Path
) -> None:
    daemon = make_daemon(env=FAST_KILL)
    sweep_id, leader, grandchild = start_escaper(daemon, tmp_path, "--exit")

    trial = ended_trial(daemon, sweep_id)

    assert (trial["status"], trial["exit_code"]) == ("succeeded", 0), trial
    assert not alive(grandchild), grandchild
    assert_no_orphans(daemon)


def test_a_time_limit_stops_the_grandchild(make_daemon: DaemonFactory, tmp_path: Path) -> None:
    daemon = make_daemon(env=FAST_KILL)
    sweep_id, leader, grandchild = start_escaper(daemon, tmp_path, "--ignore-term", time_limit_s=1)

    trial = ended_trial(daemon, sweep_id)

    assert trial["status"] == "failed" and "time limit" in trial["error"], trial
    assert not alive(leader) and not alive(grandchild), (leader, grandchild)
    assert_no_orphans(daemon)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["graceful-stop", "kill-9"])
def test_after_a_restart_of_the_daemon_a_cancel_stops_the_grandchild(
    make_daemon: DaemonFactory, tmp_path: Path, stop: signal.Signals
) -> None:
    daemon = make_daemon(env=FAST_KILL)
    sweep_id, leader, grandchild = start_escaper(daemon, tmp_path, "--ignore-term")

    daemon.stop(stop)
    assert alive(leader) and alive(grandchild), "a graceful stop or a crash leaves trials running"
    daemon.start()
    cancel(daemon, sweep_id)
    trial = ended_trial(daemon, sweep_id)

    assert trial["status"] == "cancelled", trial
    assert not alive(leader) and not alive(grandchild), (leader, grandchild)
    assert_no_orphans(daemon)


@pytest.mark.parametrize("daemon_too", [False, True], ids=["daemon-running", "daemon-killed-too"])
def test_a_supervisor_killed_with_9_leaves_no_grandchild(
    make_daemon: DaemonFactory, tmp_path: Path, daemon_too: bool
) -> None:
    # With no supervisor, no subreaper holds the grandchild: the daemon finds it by the
    # attempt's report token in its environment.
    daemon = make_daemon(env={**FAST_KILL, "GPUMUX_LOST_RETRIES": "0"})
    sweep_id, leader, grandchild = start_escaper(daemon, tmp_path, "--ignore-term")
    supervisor = parent_of(leader)

    if daemon_too:
        daemon.kill9()
    os.kill(supervisor, signal.SIGKILL)
    if daemon_too:
        daemon.start()
    trial = ended_trial(daemon, sweep_id)

    assert trial["status"] == "lost", trial
    wait_until(daemon, "the grandchild to die", lambda: not alive(grandchild))
    assert not alive(leader)
    assert_no_orphans(daemon)
