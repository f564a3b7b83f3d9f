"""A full disk and a runaway log, on a real small filesystem under a real daemon.

Each test mounts an 8 MiB tmpfs (root only) and runs `gpumux serve` with its home there; the
daemon's own output and the fixtures' marker files stay outside it, so that the test can
drive the trials whether that disk has room or not.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import DaemonFactory, DaemonProcess

FIXTURES = Path(__file__).parent.parent / "fixtures"
TIMEOUT_S = 30.0
POLL_S = 0.05
KIB = 1024
MIB = 1024 * KIB
DISK_SIZE = "8m"
LOST = re.compile(rb"\[gpumux: (\d+) bytes of output lost: no space left on device\]")
ROTATED = b"[gpumux: log rotated; the earlier output is in the .1 file]\n"
FINAL = {"succeeded", "failed", "cancelled", "lost"}
# Fast ticks and heartbeats: a test waits for the daemon's reactions, not for its pace.
FAST = {"GPUMUX_POLL_INTERVAL": "0.2", "GPUMUX_HEARTBEAT_INTERVAL": "0.2"}

StartDaemon = Callable[..., DaemonProcess]


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A fresh 8 MiB tmpfs, unmounted at the end of the test however it ends."""
    if os.geteuid() != 0:
        pytest.skip("filling a disk needs a small tmpfs, and mounting one needs root")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    options = f"size={DISK_SIZE},mode=0700"
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
            capture_output=True,
            text=True,
        )
    except FileNotFoundError:
        pytest.skip("no mount command to mount a tmpfs with")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        unmounted = subprocess.run(["umount", str(mount_point)], capture_output=True, text=True)
        if unmounted.returncode != 0:
            # A process the test started still holds a file there: detach the mount anyway.
            subprocess.run(["umount", "--lazy", str(mount_point)], check=True)
            pytest.fail(f"{mount_point} was still in use at the end: {unmounted.stderr.strip()}")


@pytest.fixture
def start_daemon(disk: Path, make_daemon: DaemonFactory, tmp_path: Path) -> StartDaemon:
    """Start `gpumux serve` with its home on the small disk and its output beside the test.

    Taking `disk` before make_daemon has the disk unmounted after every daemon has stopped.
    """

    def start(**env: str) -> DaemonProcess:
        daemon = make_daemon(home=disk / "home", env={**FAST, **env}, start=False)
        daemon.log_path = tmp_path / "daemon.log"
        daemon.start()
        return daemon

    return start


def fill(disk: Path) -> Path:
    """Fill the disk to its last byte with one file; remove that file to free the space."""
    filler = disk / "filler"
    descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        # Big blocks while they fit, then single bytes for the rest.
        for block in (b"\0" * (256 * KIB), b"\0"):
            try:
                while True:
                    os.write(descriptor, block)
            except OSError as error:
                assert error.errno == errno.ENOSPC, error
    finally:
        os.close(descriptor)
    assert shutil.disk_usage(disk).free < 64 * KIB
    return filler


def wait_until(
    condition: Callable[[], Any], what: str, daemon: DaemonProcess, timeout: float = TIMEOUT_S
) -> Any:
    """Poll `condition` until it returns something true, and return that."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{daemon.log_tail()}"
        time.sleep(POLL_S)
    return result


def sweep_body(workdir: Path, command: list[str], *params: str, split: int = 1) -> dict[str, Any]:
    return {
        "params": list(params),
        "command": command,
        "workdir": str(workdir),
        "env": {"PATH": os.environ["PATH"]},
        "split": split,
    }


def submit(client: httpx.Client, body: dict[str, Any]) -> int:
    created = client.post("/sweeps", json=body)
    assert created.status_code == 201, created.text
    sweep_id: int = created.json()["id"]
    return sweep_id


def trials_of(client: httpx.Client, sweep_id: int) -> list[dict[str, Any]]:
    page = client.get(f"/sweeps/{sweep_id}/trials", params={"limit": 1000})
    assert page.status_code == 200, page.text
    trials: list[dict[str, Any]] = page.json()["data"]
    return trials


def trial(client: httpx.Client, trial_id: int) -> dict[str, Any]:
    answer = client.get(f"/trials/{trial_id}")
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


def finished(client: httpx.Client, sweep_id: int) -> list[dict[str, Any]] | None:
    """The sweep's trials once every one has ended, else None."""
    trials = trials_of(client, sweep_id)
    return trials if all(t["status"] in FINAL for t in trials) else None


def chatter(markers: Path, *options: str) -> list[str]:
    return [sys.executable, str(FIXTURES / "chatter.py"), str(markers), *options]


def run_dir(daemon: DaemonProcess, trial_id: int) -> Path:
    return daemon.home / "runs" / f"{trial_id}.1"


def attempts_run(daemon: DaemonProcess, trial_id: int) -> list[str]:
    """The run directories of a trial: one per attempt whose command was started."""
    return sorted(path.name for path in (daemon.home / "runs").glob(f"{trial_id}.*"))


def log_of(daemon: DaemonProcess, found: dict[str, Any]) -> bytes:
    """The log of the trial's first attempt."""
    sweep_logs = daemon.home / "logs" / f"sweep-{found['sweep_id']}"
    return (sweep_logs / f"trial-{found['id']}.1.log").read_bytes()


def age_tokens(daemon: DaemonProcess) -> None:
    """Make every API token look last used long ago, so that its next use is due a write."""
    database = sqlite3.connect(daemon.home / "gpumux.db", timeout=TIMEOUT_S)
    try:
        with database:
            database.execute("UPDATE api_tokens SET last_used_at = '2000-01-01 00:00:00.000000'")
    finally:
        database.close()


def assert_refused_as_full(refused: httpx.Response, daemon: DaemonProcess) -> None:
    """The answer of gpumux.server.api.errors to a write the full disk refused: 507, and why."""
    assert refused.status_code == 507, refused.text
    assert refused.json()["detail"] == (
        f"the database {daemon.home / 'gpumux.db'} is full: its disk has no space left (or it "
        "reached its size limit); nothing of this request was stored. Free space on that disk, "
        "then try again"
    )


def test_trials_outlive_a_full_disk_and_their_exits_and_lost_output_are_recorded_afterwards(
    start_daemon: StartDaemon, disk: Path, tmp_path: Path
) -> None:
    daemon = start_daemon()
    markers = tmp_path / "markers"
    markers.mkdir()
    with daemon.client() as client:
        sweep_id = submit(client, sweep_body(tmp_path, chatter(markers), "code=0,3", split=2))
        ids = [t["id"] for t in trials_of(client, sweep_id)]
        wait_until(lambda: all((markers / f"ready.{i}").exists() for i in ids), "trials", daemon)
        wait_until(lambda: all(trial(client, i)["pid"] for i in ids), "their pids", daemon)
        # As after a minute of use: the next request is due to note the token's use, a write
        # that a full disk refuses; the request must be answered all the same.
        age_tokens(daemon)
        filler = fill(disk)

        # Each trial floods 2 MiB into a log that cannot take a byte of it, and runs on.
        (markers / "flood").touch()
        wait_until(
            lambda: all((markers / f"flooded.{i}").exists() for i in ids), "the floods", daemon
        )
        refused = client.post("/sweeps", json=sweep_body(tmp_path, chatter(markers), "x=1..200"))
        assert_refused_as_full(refused, daemon)
        health = client.get("/health")
        assert health.status_code == 200, health.text
        assert health.json()["active_trials"] == 2
        assert [t["status"] for t in trials_of(client, sweep_id)] == ["running", "running"]
        assert client.get("/sweeps").json()["count"] == 1

        filler.unlink()
        (markers / "stop").touch()
        ended = wait_until(lambda: finished(client, sweep_id), "the trials' ends", daemon)

        by_code = {t["params"]["code"]: t for t in ended}
        assert (by_code[0]["status"], by_code[0]["exit_code"]) == ("succeeded", 0), by_code[0]
        assert (by_code[3]["status"], by_code[3]["exit_code"]) == ("failed", 3), by_code[3]
        for found in ended:
            assert found["attempt"] == 1, found
            assert attempts_run(daemon, found["id"]) == [f"{found['id']}.1"]
            log = log_of(daemon, found)
            (lost,) = LOST.findall(log)
            # The whole flood, less what the pipe still held when the space came back.
            assert 2 * MIB - 64 * KIB <= int(lost) <= 2 * MIB, log[-300:]
            notice = log.index(b"[gpumux: ")
            assert log.index(b"chatter: started") < notice < log.index(b"chatter: done\n")
            assert log.endswith(b"chatter: done\n"), log[-300:]

        after = submit(client, sweep_body(tmp_path, [sys.executable, "-c", "print('after')"]))
        (landed,) = wait_until(lambda: finished(client, after), "the next sweep", daemon)
        assert (landed["status"], landed["exit_code"], landed["attempt"]) == ("succeeded", 0, 1)
    assert daemon.running


def test_a_trial_that_ends_on_a_full_disk_is_recorded_once_there_is_room(
    start_daemon: StartDaemon, disk: Path, tmp_path: Path
) -> None:
    timeout = 1.0
    daemon = start_daemon(GPUMUX_HEARTBEAT_TIMEOUT=str(timeout))
    markers = tmp_path / "markers"
    markers.mkdir()
    with daemon.client() as client:
        sweep_id = submit(client, sweep_body(tmp_path, chatter(markers, "--code=7"), "x=1"))
        (first,) = trials_of(client, sweep_id)
        trial_id = first["id"]
        records = run_dir(daemon, trial_id)
        wait_until(lambda: (markers / f"ready.{trial_id}").exists(), "the trial", daemon)
        leader = wait_until(lambda: trial(client, trial_id)["pid"], "its pid", daemon)
        supervisor = json.loads((records / "supervisor.json").read_text())["pid"]
        filler = fill(disk)
        (markers / "flood").touch()
        (markers / "stop").touch()
        wait_until(lambda: not Path(f"/proc/{leader}").exists(), "the trial's exit", daemon)
        ended_at = time.time()

        # Its supervisor cannot write exit.json: it waits, heartbeating, for longer than the
        # daemon lets a silent supervisor live; the trial is neither lost nor run again.
        def heartbeats_past_the_timeout() -> bool:
            assert Path(f"/proc/{supervisor}").exists(), "the supervisor died on a full disk"
            assert not (records / "exit.json").exists()
            assert trial(client, trial_id)["status"] == "running"
            return (records / "heartbeat").stat().st_mtime > ended_at + 2 * timeout

        wait_until(heartbeats_past_the_timeout, "heartbeats while the disk is full", daemon)

        filler.unlink()
        (ended,) = wait_until(lambda: finished(client, sweep_id), "the trial's end", daemon)
        assert (ended["status"], ended["exit_code"], ended["attempt"]) == ("failed", 7, 1), ended
        assert attempts_run(daemon, trial_id) == [f"{trial_id}.1"]
        assert not Path(f"/proc/{supervisor}").exists()
        # Its last output went nowhere: the log must say so, as it does for a trial that goes
        # on printing once there is room.
        log = log_of(daemon, ended)
        assert LOST.search(log), log[-300:]


def test_a_leader_pid_seen_while_the_disk_fills_is_recorded_once_there_is_room(
    start_daemon: StartDaemon, disk: Path, tmp_path: Path
) -> None:
    daemon = start_daemon()
    markers = tmp_path / "markers"
    markers.mkdir()
    with daemon.client() as client:
        sweep_id = submit(client, sweep_body(tmp_path, chatter(markers, "--flood-mb=0"), "x=1"))
        (first,) = trials_of(client, sweep_id)
        leader = run_dir(daemon, first["id"]) / "trial.json"
        wait_until(leader.exists, "the supervisor's record of the trial's pid", daemon)
        # The daemon records the pid at about this moment: before the disk is full, or after
        # (its commit fails, and it tries again at the next tick). Either way it lands.
        filler = fill(disk)
        pid = json.loads(leader.read_text())["pid"]
        filler.unlink()
        wait_until(
            lambda: trial(client, first["id"])["pid"] == pid,
            "the pid recorded at a tick with room on the disk",
            daemon,
        )
        (markers / "flood").touch()
        (markers / "stop").touch()
        (ended,) = wait_until(lambda: finished(client, sweep_id), "the trial's end", daemon)
        assert (ended["status"], ended["exit_code"], ended["attempt"]) == ("succeeded", 0, 1)
        assert ended["pid"] == pid, ended


def test_a_runaway_log_is_rotated_within_its_cap_and_its_tail_is_still_served(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    daemon = start_daemon(GPUMUX_LOG_MAX_MB="1", GPUMUX_LOG_KEEP="2")
    # 30.5 MiB: the last piece is half full, not just opened by a rotation.
    lines = 30 * 1024 + 512
    with daemon.client() as client:
        command = [sys.executable, str(FIXTURES / "runaway.py"), "--mb=30.5"]
        sweep_id = submit(client, sweep_body(tmp_path, command))
        (first,) = trials_of(client, sweep_id)
        logs = daemon.home / "logs" / f"sweep-{sweep_id}"
        peak = 0

        def ended_while_measuring() -> list[dict[str, Any]] | None:
            nonlocal peak
            used = 0
            for piece in logs.glob("*"):
                try:
                    used += piece.stat().st_size
                except FileNotFoundError:
                    continue  # rotated away between the listing and the look
            peak = max(peak, used)
            return finished(client, sweep_id)

        (ended,) = wait_until(ended_while_measuring, "the runaway trial", daemon)
        assert (ended["status"], ended["exit_code"], ended["attempt"]) == ("succeeded", 0, 1)

        name = f"trial-{first['id']}.1.log"
        pieces = sorted(path.name for path in logs.iterdir() if path.suffix != ".base")
        assert pieces == [name, f"{name}.1", f"{name}.2"], pieces
        # Offsets count the whole output: the current piece starts where the rotated ones end.
        base = json.loads((logs / f"{name}.base").read_text())["base"]
        sizes = {piece: (logs / piece).stat().st_size for piece in pieces}
        assert all(size <= MIB + 64 * KIB for size in sizes.values()), sizes
        assert peak < 4 * MIB, peak

        # The pieces kept hold the newest output, in order, with nothing lost between them.
        text = b"".join((logs / piece).read_bytes() for piece in reversed(pieces))
        assert not LOST.search(text)
        assert text.count(ROTATED) == 3
        kept = text.replace(ROTATED, b"").splitlines()
        numbers = [int(line[:8]) for line in kept[:-1]]
        assert numbers == list(range(numbers[0], lines)), "a gap in the output kept"
        assert kept[-1] == b"runaway: done"

        tail = client.get(f"/trials/{first['id']}/log").json()
        assert tail["data"].endswith(f"{lines - 1:08d} {'x' * 1014}\nrunaway: done\n")
        assert (tail["size"], tail["complete"]) == (base + sizes[name], True)
        # A follower that fell behind the rotation is told how much it missed, not fed a gap.
        oldest = base - sizes[f"{name}.1"] - sizes[f"{name}.2"]
        behind = client.get(f"/trials/{first['id']}/log", params={"offset": 10}).json()
        assert (behind["offset"], behind["skipped"]) == (oldest, oldest - 10)
        kept_piece = (logs / f"{name}.2").read_bytes()
        assert behind["data"].encode() == kept_piece[: len(behind["data"].encode())]


def test_a_daemon_started_on_a_full_disk_refuses_with_a_clear_message_and_loses_nothing(
    start_daemon: StartDaemon, disk: Path, tmp_path: Path
) -> None:
    daemon = start_daemon()
    with daemon.client() as client:
        sweep_ids = [
            submit(client, sweep_body(tmp_path, [sys.executable, "-c", "pass"], "x=1..3")),
            submit(client, sweep_body(tmp_path, [sys.executable, "-c", "exit(2)"], "y=1,2")),
        ]
        before = {
            sweep_id: wait_until(partial(finished, client, sweep_id), "the sweeps", daemon)
            for sweep_id in sweep_ids
        }
    # A graceful stop closes the database: SQLite removes its -wal and -shm files, which the next
    # start must create again.
    assert daemon.stop() == 0
    assert not (daemon.home / "gpumux.db-shm").exists()
    filler = fill(disk)
    logged = daemon.log_path.stat().st_size

    with pytest.raises(AssertionError, match="daemon did not start"):
        daemon.start()
    assert daemon.popen is not None and daemon.popen.returncode != 0
    with open(daemon.log_path, "rb") as log:
        log.seek(logged)
        output = log.read().decode()
    assert "Traceback" not in output, output
    (error,) = [line for line in output.splitlines() if line.startswith("error: ")]
    assert str(daemon.home / "gpumux.db") in error
    # The database is sound: only the disk is full, and the message must say so.
    assert "no space left" in error or "disk is full" in error, error
    assert "move it aside" not in error, error

    filler.unlink()
    database = sqlite3.connect(daemon.home / "gpumux.db")
    try:
        assert database.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        database.close()
    daemon.start()
    with daemon.client() as client:
        assert client.get("/sweeps").json()["count"] == 2
        assert {sweep_id: trials_of(client, sweep_id) for sweep_id in sweep_ids} == before


def test_a_daemon_restarted_after_a_crash_on_a_full_disk_serves_what_it_has(
    start_daemon: StartDaemon, disk: Path, tmp_path: Path
) -> None:
    daemon = start_daemon()
    with daemon.client() as client:
        sweep_id = submit(client, sweep_body(tmp_path, [sys.executable, "-c", "pass"], "x=1..3"))
        before = wait_until(lambda: finished(client, sweep_id), "the sweep", daemon)
    age_tokens(daemon)
    # Killed, it leaves its -wal and -shm files behind: the next start needs no new space.
    daemon.kill9()
    filler = fill(disk)

    daemon.start()
    with daemon.client() as client:
        assert trials_of(client, sweep_id) == before
        refused = client.post("/sweeps", json=sweep_body(tmp_path, ["true"], "x=1"))
        assert_refused_as_full(refused, daemon)
        assert client.get("/sweeps").json()["count"] == 1

        filler.unlink()
        after = submit(client, sweep_body(tmp_path, [sys.executable, "-c", "pass"], "x=1"))
        (landed,) = wait_until(lambda: finished(client, after), "the next sweep", daemon)
        assert (landed["status"], landed["exit_code"]) == ("succeeded", 0)
        assert trials_of(client, sweep_id) == before
