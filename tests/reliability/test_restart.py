"""Nothing lost: trials survive a daemon's crash, graceful stop and restart, and run once each."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from .conftest import DaemonFactory, DaemonProcess

FIXTURES = Path(__file__).parent.parent / "fixtures"
RELEASE_THEN_EXIT = FIXTURES / "release_then_exit.py"
TIMEOUT_S = 30.0
POLL_S = 0.05
KILL_GRACE_S = 1.0
# From the grace period's end to the trial recorded as killed, on a loaded 2-core machine.
KILL_SLACK_S = 5.0
FAST_KILL = {"GPUMUX_KILL_GRACE": str(KILL_GRACE_S)}

T = TypeVar("T")


def wait_until(daemon: DaemonProcess, what: str, condition: Callable[[], T | None]) -> T:
    """Poll `condition` until it returns something true, and return that; fail with the
    daemon's log after TIMEOUT_S."""
    deadline = time.monotonic() + TIMEOUT_S
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{daemon.log_tail()}"
        time.sleep(POLL_S)
    return value


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie has exited: it only waits to be collected)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def command_line(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return "(gone)"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def submit(daemon: DaemonProcess, folder: Path, xs: Iterable[int], **fields: Any) -> int:
    """A sweep of release_then_exit.py trials, one per x, all running at once; its id."""
    values = ",".join(str(x) for x in xs)
    body = {
        "params": [f"x={values}"],
        "command": [sys.executable, str(RELEASE_THEN_EXIT), str(folder)],
        "workdir": str(folder),
        "env": {"PATH": os.environ["PATH"]},
        "split": 6,
        **fields,
    }
    with daemon.client() as client:
        created = client.post("/sweeps", json=body)
    assert created.status_code == 201, created.text
    sweep_id: int = created.json()["id"]
    return sweep_id


def record(folder: Path, x: int, attempt: int) -> dict[str, Any] | None:
    """What attempt `attempt` of trial x wrote once it started, or None before."""
    try:
        value: dict[str, Any] = json.loads((folder / f"trial-{x}.{attempt}.json").read_text())
    except FileNotFoundError:
        return None
    return value


def wait_started(
    daemon: DaemonProcess, folder: Path, xs: Iterable[int], attempt: int = 1
) -> dict[int, dict[str, Any]]:
    """The records of attempt `attempt` of each trial x, once every one of them runs."""
    xs = list(xs)

    def records() -> dict[int, dict[str, Any]] | None:
        found = {x: record(folder, x, attempt) for x in xs}
        return {x: r for x, r in found.items() if r is not None} if all(found.values()) else None

    return wait_until(daemon, f"attempt {attempt} of trials {xs} to start", records)


def release(folder: Path, xs: Iterable[int]) -> None:
    for x in xs:
        (folder / f"release-{x}").touch()


def starts(folder: Path, x: int) -> list[int]:
    """The attempt of each run of trial x's command, in order."""
    lines = (folder / f"started-{x}").read_text().splitlines()
    return [int(line.split()[0]) for line in lines]


def wait_finished(daemon: DaemonProcess, sweep_id: int) -> dict[int, dict[str, Any]]:
    """The sweep's trials by x, once the sweep has finished or been cancelled."""

    def finished() -> bool:
        with daemon.client() as client:
            sweep = client.get(f"/sweeps/{sweep_id}").json()
        return sweep["status"] in ("finished", "cancelled")

    wait_until(daemon, f"sweep {sweep_id} to finish", finished)
    with daemon.client() as client:
        rows = client.get(f"/sweeps/{sweep_id}/trials").json()["data"]
    return {int(row["params"]["x"]): row for row in rows}


def outcome(row: dict[str, Any]) -> tuple[str, int | None, int | None, int]:
    return row["status"], row["exit_code"], row["signal"], row["attempt"]


def true_outcome(x: int, attempt: int = 1) -> tuple[str, int | None, int | None, int]:
    """How trial x ends when it runs to its end: release_then_exit.py exits with code x."""
    return ("succeeded" if x == 0 else "failed"), x, None, attempt


def assert_no_orphans(daemon: DaemonProcess) -> None:
    """Nothing the daemon started runs on (a supervisor may take a moment to exit)."""
    deadline = time.monotonic() + TIMEOUT_S
    while (left := daemon.spawned()) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    assert not left, {pid: command_line(pid) for pid in left}


def test_a_kill_9_of_the_daemon_loses_no_trial_and_runs_none_twice(
    make_daemon: DaemonFactory, tmp_path: Path
) -> None:
    daemon = make_daemon(env=FAST_KILL)
    sweep_id = submit(daemon, tmp_path, range(6))
    first = wait_started(daemon, tmp_path, range(6))

    daemon.kill9()
    # Supervisors and trials outlive the daemon.
    assert all(alive(r["pid"]) and alive(r["ppid"]) for r in first.values()), first
    # Half end while no daemon runs: their supervisors record the exit status and are gone.
    release(tmp_path, range(3))
    wait_until(
        daemon,
        "trials 0-2 and their supervisors to exit",
        lambda: not any(alive(first[x]["pid"]) or alive(first[x]["ppid"]) for x in range(3)),
    )
    daemon.start()
    release(tmp_path, range(3, 6))
    rows = wait_finished(daemon, sweep_id)

    assert {x: outcome(row) for x, row in rows.items()} == {x: true_outcome(x) for x in range(6)}
    assert {x: starts(tmp_path, x) for x in range(6)} == {x: [1] for x in range(6)}
    assert_no_orphans(daemon)


def test_a_graceful_stop_leaves_trials_running_and_the_next_daemon_adopts_them(
    make_daemon: DaemonFactory, tmp_path: Path
) -> None:
    daemon = make_daemon(env=FAST_KILL)
    sweep_id = submit(daemon, tmp_path, range(3))
    first = wait_started(daemon, tmp_path, range(3))

    assert daemon.stop(signal.SIGTERM) == 0
    assert all(alive(r["pid"]) and alive(r["ppid"]) for r in first.values()), first
    daemon.start()
    release(tmp_path, range(3))
    rows = wait_finished(daemon, sweep_id)

    assert {x: outcome(row) for x, row in rows.items()} == {x: true_outcome(x) for x in range(3)}
    assert {x: starts(tmp_path, x) for x in range(3)} == {x: [1] for x in range(3)}
    assert_no_orphans(daemon)


def test_a_graceful_stop_with_stop_trials_requeues_them_and_the_restart_runs_them_again(
    make_daemon: DaemonFactory, tmp_path: Path
) -> None:
    daemon = make_daemon(env=FAST_KILL, args=["--stop-trials"])
    sweep_id = submit(daemon, tmp_path, range(3))
    first = wait_started(daemon, tmp_path, range(3))

    assert daemon.stop(signal.SIGTERM) == 0
    # The daemon waited for them: stopped, no process left.
    assert not any(alive(r["pid"]) or alive(r["ppid"]) for r in first.values()), first
    assert not daemon.spawned()
    daemon.start()
    wait_started(daemon, tmp_path, range(3), attempt=2)
    release(tmp_path, range(3))
    rows = wait_finished(daemon, sweep_id)

    assert {x: outcome(row) for x, row in rows.items()} == {
        x: true_outcome(x, attempt=2) for x in range(3)
    }
    assert {x: starts(tmp_path, x) for x in range(3)} == {x: [1, 2] for x in range(3)}
    assert_no_orphans(daemon)


def post_report(
    client: httpx.Client, *, trial_id: int, token: str, attempt: int, loss: float
) -> httpx.Response:
    return client.post(
        "/reports",
        json={
            "trial_id": trial_id,
            "attempt": attempt,
            "kind": "manual",
            "metrics": {"loss": loss},
        },
        headers={"Authorization": f"Bearer {token}"},
    )


def test_a_stale_report_from_attempt_1_is_refused_once_attempt_2_runs(
    make_daemon: DaemonFactory, tmp_path: Path
) -> None:
    daemon = make_daemon(env={**FAST_KILL, "GPUMUX_STOP_TRIALS": "1"})
    sweep_id = submit(daemon, tmp_path, [0], objective="loss:min")
    first = wait_started(daemon, tmp_path, [0])[0]
    assert daemon.stop(signal.SIGTERM) == 0
    daemon.start()
    second = wait_started(daemon, tmp_path, [0], attempt=2)[0]
    trial_id = second["trial_id"]

    with daemon.client() as client:
        current = post_report(client, trial_id=trial_id, token=second["token"], attempt=2, loss=5.0)
        assert current.status_code == 204, current.text
        reports = client.get(f"/trials/{trial_id}/reports").json()
        assert [(r["attempt"], r["metrics"]) for r in reports["data"]] == [(2, {"loss": 5.0})]

        # Better losses, which would become the trial's objective if they were believed.
        stale = post_report(client, trial_id=trial_id, token=first["token"], attempt=1, loss=0.0)
        renumbered = post_report(
            client, trial_id=trial_id, token=first["token"], attempt=2, loss=0.0
        )
        old_number = post_report(
            client, trial_id=trial_id, token=second["token"], attempt=1, loss=0.0
        )
        assert (stale.status_code, renumbered.status_code, old_number.status_code) == (
            403,
            403,
            409,
        ), (stale.text, renumbered.text, old_number.text)
        assert client.get(f"/trials/{trial_id}/reports").json() == reports
        assert client.get(f"/trials/{trial_id}").json()["objective"] == 5.0

    release(tmp_path, [0])
    rows = wait_finished(daemon, sweep_id)
    assert outcome(rows[0]) == true_outcome(0, attempt=2)
    assert rows[0]["objective"] == 5.0
    assert_no_orphans(daemon)


def test_a_trial_that_ignores_sigterm_is_killed_after_the_grace_period(
    make_daemon: DaemonFactory, tmp_path: Path
) -> None:
    daemon = make_daemon(env=FAST_KILL)
    pids_path = tmp_path / "pids.json"
    with daemon.client() as client:
        created = client.post(
            "/sweeps",
            json={
                "params": ["x=0"],
                "command": [sys.executable, str(FIXTURES / "ignore_term.py"), str(pids_path)],
                "workdir": str(tmp_path),
                "env": {"PATH": os.environ["PATH"]},
                "split": 1,
            },
        )
        assert created.status_code == 201, created.text
        sweep_id = created.json()["id"]
        pids = wait_until(
            daemon,
            "the trial to start its grandchild",
            lambda: json.loads(pids_path.read_text()) if pids_path.exists() else None,
        )
        cancelled_at = time.monotonic()
        assert client.post(f"/sweeps/{sweep_id}/cancel").status_code == 202
    rows = wait_finished(daemon, sweep_id)
    took = time.monotonic() - cancelled_at

    assert outcome(rows[0]) == ("cancelled", None, signal.SIGKILL, 1)
    assert KILL_GRACE_S <= took < KILL_GRACE_S + KILL_SLACK_S, took
    assert not alive(pids["pid"]) and not alive(pids["grandchild"]), pids
    assert_no_orphans(daemon)


def test_a_supervisor_killed_with_9_leaves_its_trial_lost_and_requeued_with_no_orphans(
    make_daemon: DaemonFactory, tmp_path: Path
) -> None:
    daemon = make_daemon(env=FAST_KILL)
    sweep_id = submit(daemon, tmp_path, range(2))
    first = wait_started(daemon, tmp_path, range(2))
    supervisor = first[1]["ppid"]
    # Forked by the daemon's spawner, it shares the spawner's command line.
    assert "spawner_process.py" in command_line(supervisor), command_line(supervisor)

    os.kill(supervisor, signal.SIGKILL)
    second = wait_started(daemon, tmp_path, [1], attempt=2)[1]
    # The daemon killed the first attempt, orphaned, when it found its supervisor gone.
    wait_until(daemon, "the first attempt to die", lambda: not alive(first[1]["pid"]))
    with daemon.client() as client:
        trial = client.get(f"/trials/{second['trial_id']}").json()
    assert trial["status"] in ("starting", "running") and trial["attempt"] == 2, trial
    assert "attempt 1 lost its supervisor" in trial["error"], trial["error"]
    release(tmp_path, range(2))
    rows = wait_finished(daemon, sweep_id)

    assert {x: outcome(row) for x, row in rows.items()} == {
        0: true_outcome(0),
        1: true_outcome(1, attempt=2),
    }
    assert {x: starts(tmp_path, x) for x in range(2)} == {0: [1], 1: [1, 2]}
    assert_no_orphans(daemon)
