"""The per-attempt supervisor, run for real as the daemon runs it: isolated, `python -I -S`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpumux.processes import procfs, rundir, supervisor
from gpumux.processes.supervised import SUPERVISOR_PATH, supervisor_command

FIXTURES = Path(__file__).parents[1] / "fixtures"
# The node lease the tests write, renewed every 0.1 s as the daemon's heartbeat does: long
# enough that a test process held off the CPU for a second on a loaded host still renews in time.
LEASE_S = 2.0


def start(
    tmp_path: Path, argv: list[str], *, go: bool = True, stderr: int | None = None, **overrides: Any
) -> tuple[subprocess.Popen[bytes], Path]:
    """A supervisor for `argv`, started on a spec like the daemon writes, and told to go
    (or, without `go`, its stdin closed as when the daemon dies before it says so)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = {
        "trial_id": 7,
        "attempt": 2,
        "argv": argv,
        "cwd": str(tmp_path),
        "env": {"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1"},
        "user": None,
        "log_path": str(tmp_path / "trial.log"),
        "log_max_bytes": 1024 * 1024,
        "log_keep": 2,
        "kill_grace": 0.5,
        "heartbeat_interval": 0.2,
        "banner": "gpumux: banner\n",
        **overrides,
    }
    (run_dir / rundir.SPEC).write_text(json.dumps(spec))
    process = subprocess.Popen(
        supervisor_command(run_dir),
        start_new_session=True,
        stdin=subprocess.PIPE,
        stderr=stderr,
    )
    assert process.stdin is not None
    with process.stdin:
        if go:
            process.stdin.write(supervisor.GO)
    return process, run_dir


def exit_record(process: subprocess.Popen[bytes], run_dir: Path) -> dict[str, Any]:
    assert process.wait(timeout=60) == 0
    record: dict[str, Any] = json.loads((run_dir / rundir.EXIT_RECORD).read_text())
    return record


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def escaped(pidfile: Path, request: pytest.FixtureRequest) -> tuple[int, int]:
    """The leader and the escaped grandchild escaper.py recorded; the grandchild is killed at
    the end of the test if it is still the same process (no supervisor may have done it)."""
    leader, grandchild = (int(pid) for pid in pidfile.read_text().split())
    started = procfs.start_ticks(grandchild)

    def kill() -> None:
        if started is not None and procfs.start_ticks(grandchild) == started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(grandchild, signal.SIGKILL)

    request.addfinalizer(kill)
    return leader, grandchild


def test_the_supervisor_imports_only_what_it_needs() -> None:
    # Each trial attempt pays for these imports: pathlib, dataclasses and logging alone would
    # add tens of milliseconds, and gpumux's other modules would cross its boundary.
    script = (
        "import sys; sys.path.append(sys.argv[1].rsplit('/', 3)[0])\n"
        "import gpumux.processes.supervisor\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script, SUPERVISOR_PATH],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    outside_the_standard_library = {
        name for name in loaded if name.split(".")[0] not in sys.stdlib_module_names
    }
    assert outside_the_standard_library == {
        "__main__",
        "gpumux",
        "gpumux.processes",
        "gpumux.processes.logfiles",
        "gpumux.processes.procfs",
        "gpumux.processes.reaping",
        "gpumux.processes.rundir",
        "gpumux.processes.supervisor",
        "gpumux.processes.trialstart",
    }
    assert not {"pathlib", "dataclasses", "logging", "subprocess"} & set(loaded)


def test_the_exit_code_and_the_output_are_recorded(tmp_path: Path) -> None:
    script = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    process, run_dir = start(tmp_path, [sys.executable, "-c", script])
    record = exit_record(process, run_dir)
    assert (record["exit_code"], record["signal"], record["error"]) == (3, None, None)
    assert (record["trial_id"], record["attempt"]) == (7, 2)
    assert (tmp_path / "trial.log").read_text().splitlines() == ["gpumux: banner", "out", "err"]
    leader = json.loads((run_dir / rundir.LEADER_RECORD).read_text())
    assert leader["pid"] == leader["pgid"] and leader["started"] > 0
    assert (run_dir / rundir.HEARTBEAT).exists()


def test_without_the_daemons_go_the_trial_never_starts(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    process, run_dir = start(tmp_path, ["touch", str(marker)], go=False)
    assert process.wait(timeout=60) == 0
    assert not marker.exists(), "the trial ran though no daemon recorded its supervisor"
    assert not (run_dir / rundir.LEADER_RECORD).exists()
    assert not (run_dir / rundir.EXIT_RECORD).exists()


def test_a_command_that_cannot_start_is_recorded_with_the_reason(tmp_path: Path) -> None:
    process, run_dir = start(tmp_path, ["no-such-command-gpumux"])
    record = exit_record(process, run_dir)
    assert record["exit_code"] is None
    assert record["error"].startswith("command not found: 'no-such-command-gpumux'")
    assert "command not found" in (tmp_path / "trial.log").read_text()


def test_an_exit_record_that_cannot_be_written_yet_is_written_once_it_can(tmp_path: Path) -> None:
    blocker = tmp_path / "run" / rundir.EXIT_RECORD
    # The trial puts a directory where its exit record goes: writing it fails until it is gone.
    script = f"import os; os.mkdir({str(blocker)!r}); raise SystemExit(5)"
    process, run_dir = start(tmp_path, [sys.executable, "-c", script], stderr=subprocess.PIPE)
    assert process.stderr is not None
    with process.stderr:
        complaint = process.stderr.readline().decode()
        assert complaint.startswith("gpumux supervisor: cannot record the exit:"), complaint
        assert process.poll() is None, "the supervisor waits for room instead of exiting"
        blocker.rmdir()
        record = exit_record(process, run_dir)
    assert (record["exit_code"], record["error"]) == (5, None)


def test_sigterm_stops_the_group_and_sigkill_follows_after_the_grace_period(
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "pids"
    argv = [sys.executable, str(FIXTURES / "sleeper.py"), str(pidfile), "--ignore-term"]
    process, run_dir = start(tmp_path, argv)
    wait_for(pidfile)
    leader, grandchild = (int(pid) for pid in pidfile.read_text().split())
    process.send_signal(signal.SIGTERM)
    record = exit_record(process, run_dir)
    assert record["signal"] == signal.SIGKILL, "the leader ignores SIGTERM: SIGKILL ends it"
    assert not alive(leader) and not alive(grandchild)


def test_sigusr1_kills_the_trial_at_once(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    argv = [sys.executable, str(FIXTURES / "sleeper.py"), str(pidfile), "--ignore-term"]
    process, run_dir = start(tmp_path, argv, kill_grace=600)
    wait_for(pidfile)
    process.send_signal(signal.SIGUSR1)
    assert exit_record(process, run_dir)["signal"] == signal.SIGKILL


def test_a_trial_whose_node_lease_lapses_is_killed_with_its_group(tmp_path: Path) -> None:
    # A daemon killed or frozen renews nothing: its supervisors stop their trials when the
    # lease runs out, before another node may requeue them, so no trial runs twice. The
    # supervisor looks at the lease when it would run out, not at its own heartbeat (600 s).
    lease = tmp_path / "node.lease"

    def renew() -> None:
        rundir.write_lease(lease, until=rundir.boottime() + LEASE_S)

    renew()
    pidfile = tmp_path / "pids"
    argv = [sys.executable, str(FIXTURES / "sleeper.py"), str(pidfile), "--ignore-term"]
    process, run_dir = start(
        tmp_path, argv, kill_grace=600, heartbeat_interval=600, lease_file=str(lease)
    )
    # The daemon's heartbeat, every 0.1 s: the trial starts and runs on past two lease ends.
    renewed_until = time.monotonic() + 2.5 * LEASE_S
    while not pidfile.exists() or time.monotonic() < renewed_until:
        renew()
        assert process.poll() is None, "the supervisor ended while its lease was renewed"
        time.sleep(0.1)
    leader, grandchild = (int(pid) for pid in pidfile.read_text().split())
    assert alive(leader)

    record = exit_record(process, run_dir)

    assert record["signal"] == signal.SIGKILL, "no grace: the lease is already gone"
    assert rundir.recorded_stop(run_dir) == rundir.LEASE_LAPSED
    assert "lease on the shared database lapsed" in (tmp_path / "trial.log").read_text()
    assert not alive(leader) and not alive(grandchild)


@pytest.mark.parametrize(
    "record",
    [None, {"boot_id": "another boot", "until": 1e18}, {"boot_id": "", "until": "later"}],
    ids=["missing", "another-boot", "malformed"],
)
def test_a_lease_record_missing_from_another_boot_or_malformed_counts_as_lapsed(
    tmp_path: Path, record: dict[str, Any] | None
) -> None:
    lease = tmp_path / "node.lease"
    if record is not None:
        lease.write_text(json.dumps(record | {"boot_id": record["boot_id"] or rundir.boot_id()}))
    assert rundir.lease_lapsed(lease)
    rundir.write_lease(lease, until=rundir.boottime() + 60)
    assert not rundir.lease_lapsed(lease)


def test_grandchildren_left_in_the_group_are_killed_when_the_leader_exits(
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "pid"
    script = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
    )
    process, run_dir = start(tmp_path, [sys.executable, "-c", script])
    record = exit_record(process, run_dir)
    assert record["exit_code"] == 0
    assert not alive(int(pidfile.read_text()))


def test_a_grandchild_that_left_the_group_is_killed_before_the_exit_is_recorded(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # A daemonising library: fork, setsid, fork again; the trial's leader then exits 0.
    pidfile = tmp_path / "pids"
    argv = [sys.executable, str(FIXTURES / "escaper.py"), str(pidfile), "--exit"]
    process, run_dir = start(tmp_path, argv)
    record = exit_record(process, run_dir)
    leader, grandchild = escaped(pidfile, request)
    assert record["exit_code"] == 0
    assert not alive(grandchild), "the escaped grandchild outlived its trial's recorded end"
    assert (
        "killed 1 process(es) the trial left running outside its process group"
        in (tmp_path / "trial.log").read_text()
    )


def test_sigterm_reaches_a_grandchild_outside_the_group_and_sigkill_follows(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    pidfile = tmp_path / "pids"
    argv = [sys.executable, str(FIXTURES / "escaper.py"), str(pidfile), "--ignore-term"]
    process, run_dir = start(tmp_path, argv)
    wait_for(pidfile)
    leader, grandchild = escaped(pidfile, request)
    assert os.getsid(grandchild) != os.getsid(leader), "the fixture did not leave the session"
    process.send_signal(signal.SIGTERM)
    record = exit_record(process, run_dir)
    assert record["signal"] == signal.SIGTERM, "the leader takes SIGTERM"
    assert not alive(leader) and not alive(grandchild)


def test_a_lapsed_lease_kills_a_grandchild_outside_the_group(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    lease = tmp_path / "node.lease"
    pidfile = tmp_path / "pids"
    argv = [sys.executable, str(FIXTURES / "escaper.py"), str(pidfile), "--ignore-term"]
    rundir.write_lease(lease, until=rundir.boottime() + LEASE_S)
    process, run_dir = start(tmp_path, argv, kill_grace=600, lease_file=str(lease))
    # The daemon's heartbeat renews the lease until the trial runs, then stops.
    while not pidfile.exists():
        rundir.write_lease(lease, until=rundir.boottime() + LEASE_S)
        assert process.poll() is None, "the supervisor ended while its lease was renewed"
        time.sleep(0.1)
    leader, grandchild = escaped(pidfile, request)
    record = exit_record(process, run_dir)
    assert record["signal"] == signal.SIGKILL
    assert not alive(leader) and not alive(grandchild)


def test_a_grandchild_that_left_the_group_counts_among_the_trials_processes(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # What the scheduler attributes a GPU process's memory by: the trial's group, and what
    # runs below the trial's supervisor.
    pidfile = tmp_path / "pids"
    argv = [sys.executable, str(FIXTURES / "escaper.py"), str(pidfile)]
    process, run_dir = start(tmp_path, argv)
    try:
        wait_for(pidfile)
        leader, grandchild = escaped(pidfile, request)
        members = procfs.group_members({leader}, subreapers={process.pid: leader})
    finally:
        process.send_signal(signal.SIGUSR1)
        exit_record(process, run_dir)
    assert members.get(leader) == leader
    assert members.get(grandchild) == leader, "the escaped grandchild is not the trial's"
    assert process.pid not in members


def test_the_log_is_rotated_at_its_cap_and_keeps_the_newest_pieces(tmp_path: Path) -> None:
    script = "import sys\nfor i in range(12000): print(f'line {i:05d} ' + 'x' * 40)"
    process, run_dir = start(tmp_path, [sys.executable, "-c", script], log_max_bytes=50_000)
    assert exit_record(process, run_dir)["exit_code"] == 0
    log = tmp_path / "trial.log"
    pieces = [log, log.with_name("trial.log.1"), log.with_name("trial.log.2")]
    assert all(piece.exists() for piece in pieces)
    assert not log.with_name("trial.log.3").exists()
    assert all(piece.stat().st_size < 50_000 + 64 * 1024 for piece in pieces)
    kept = [
        int(line.split()[1])
        for piece in reversed(pieces)
        for line in piece.read_text().splitlines()
        if line.startswith("line ")
    ]
    assert kept[-1] == 11999 and kept == list(range(kept[0], 12000)), "the newest, in order"
    assert len(kept) < 12000, "the oldest piece was dropped"


def test_output_lost_to_a_full_disk_is_counted_and_the_trial_runs_on(tmp_path: Path) -> None:
    # Every write to /dev/full fails with ENOSPC, as on a full disk.
    script = "print('x' * 100)\nprint('done')"
    process, run_dir = start(tmp_path, [sys.executable, "-c", script], log_path="/dev/full")
    record = exit_record(process, run_dir)
    assert (record["exit_code"], record["error"]) == (0, None)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_as_root_the_trial_runs_as_the_user_the_spec_names(tmp_path: Path) -> None:
    user = {"uid": 65534, "gid": 65534, "groups": [65534]}
    argv = ["/bin/sh", "-c", "echo $(id -u) $(id -g) $(id -G)"]
    process, run_dir = start(tmp_path, argv, user=user, cwd="/")
    assert exit_record(process, run_dir)["exit_code"] == 0
    assert (tmp_path / "trial.log").read_text().splitlines()[-1] == "65534 65534 65534"


def test_a_trial_whose_node_lease_lapsed_before_the_go_never_starts(tmp_path: Path) -> None:
    # A daemon frozen between its claim and the GO: another node may run the trial by now.
    lease = tmp_path / "node.lease"
    rundir.write_lease(lease, until=rundir.boottime() - 1)
    marker = tmp_path / "ran"
    process, run_dir = start(tmp_path, ["touch", str(marker)], lease_file=str(lease))
    record = exit_record(process, run_dir)
    assert record["exit_code"] is None and "lease" in record["error"]
    assert rundir.recorded_stop(run_dir) == rundir.LEASE_LAPSED
    assert not marker.exists()


def test_a_lapsed_lease_keeps_the_stop_gpumux_recorded_before(tmp_path: Path) -> None:
    # A pruned or cancelled trial in its grace period stays pruned or cancelled.
    lease = tmp_path / "node.lease"
    rundir.write_lease(lease, until=rundir.boottime() + LEASE_S)
    pidfile = tmp_path / "pids"
    argv = [sys.executable, str(FIXTURES / "sleeper.py"), str(pidfile), "--ignore-term"]
    process, run_dir = start(
        tmp_path, argv, kill_grace=600, heartbeat_interval=600, lease_file=str(lease)
    )
    while not pidfile.exists():
        rundir.write_lease(lease, until=rundir.boottime() + LEASE_S)
        assert process.poll() is None, "the supervisor ended while its lease was renewed"
        time.sleep(0.1)
    rundir.record_stop(run_dir, "prune")
    process.send_signal(signal.SIGTERM)
    # The lease is renewed no more: the fence kills the trial that ignores SIGTERM.
    assert exit_record(process, run_dir)["signal"] == signal.SIGKILL
    assert rundir.recorded_stop(run_dir) == "prune"
