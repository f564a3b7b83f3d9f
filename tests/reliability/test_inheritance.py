from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from .conftest import DaemonProcess, fd_targets

FIXTURES = Path(__file__).parent.parent / "fixtures"
TIMEOUT_S = 60.0


def wait_for_record(daemon: DaemonProcess, path: Path) -> dict[str, Any]:
    """The JSON the trial writes at `path`, once it is there."""
    deadline = time.monotonic() + TIMEOUT_S
    while not path.exists():
        assert time.monotonic() < deadline, f"the trial wrote no {path}\n{daemon.log_tail()}"
        time.sleep(0.05)
    record: dict[str, Any] = json.loads(path.read_text())
    return record


def wait_finished(daemon: DaemonProcess, sweep_id: int) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT_S
    with daemon.client() as client:
        while (sweep := client.get(f"/sweeps/{sweep_id}").json())["status"] != "finished":
            assert time.monotonic() < deadline, f"sweep {sweep_id}: {sweep}\n{daemon.log_tail()}"
            time.sleep(0.05)
    return dict(sweep)


def command_line(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def test_a_trial_inherits_no_database_connection_socket_or_other_daemon_descriptor(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    record_path, go = tmp_path / "fds.json", tmp_path / "go"
    os.mkfifo(go)
    command = [sys.executable, str(FIXTURES / "list_fds.py"), str(record_path), str(go)]
    with daemon.client() as client:
        created = client.post(
            "/sweeps",
            json={
                "params": ["x=1"],
                "command": command,
                "workdir": str(tmp_path),
                "env": dict(os.environ),
                "split": 1,
            },
        )
    assert created.status_code == 201, created.text
    record = wait_for_record(daemon, record_path)
    trial_pid = int(record["pid"])
    trial_fds = {int(fd): target for fd, target in record["fds"].items()}

    db = daemon.home.resolve() / "gpumux.db"
    database_files = {str(db), f"{db}-wal", f"{db}-shm", f"{db}.lock"}
    daemon_fds = set(fd_targets(daemon.pid).values())
    # Otherwise the checks below would pass for want of anything to find.
    assert database_files <= daemon_fds, daemon_fds
    assert any(target.startswith("socket:[") for target in daemon_fds), daemon_fds
    # Every descriptor the daemon holds names its object uniquely (a path, a socket or pipe
    # inode), but for /dev/null and anonymous inodes ("anon_inode:[eventpoll]").
    daemon_own = {
        target
        for target in daemon_fds
        if target != "/dev/null" and not target.startswith("anon_inode:")
    }

    assert sorted(trial_fds) == [0, 1, 2], trial_fds
    assert trial_fds[0] == "/dev/null"
    output = trial_fds[1]
    assert trial_fds[2] == output and output not in daemon_own
    spawned = daemon.spawned()
    assert trial_pid in spawned
    if output.startswith("pipe:["):
        # Output through a pipe: read by the trial's supervisor, which writes its log.
        readers = [pid for pid in spawned - {trial_pid} if output in fd_targets(pid).values()]
        assert readers, f"none of the daemon's processes reads the trial's output {output}"
    else:
        assert Path(output).parent == daemon.home.resolve() / "logs", output
    for pid in spawned:
        leaked = set(fd_targets(pid).values()) & daemon_own
        assert not leaked, f"pid {pid} ({command_line(pid)}) holds the daemon's {leaked}"

    with open(go, "wb"):
        pass  # the trial's read of the FIFO ends: it exits
    sweep = wait_finished(daemon, created.json()["id"])
    assert sweep["counts"] == {"succeeded": 1}
