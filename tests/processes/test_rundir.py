"""The run directory's records, as the supervisor writes them and the daemon reads them."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from gpumux.processes import rundir
from gpumux.processes.rundir import ExitStatus, TrialEnd


def test_an_attempt_has_its_own_run_directory(tmp_path: Path) -> None:
    assert rundir.attempt_dir(tmp_path, 7, 2) == tmp_path / "7.2"


def test_the_exit_record_is_read_back_for_its_own_attempt_only(tmp_path: Path) -> None:
    killed = ExitStatus(exit_code=None, signal=signal.SIGKILL)
    rundir.record_exit(tmp_path, trial_id=7, attempt=2, exit_status=killed, error=None, ended_at=1)
    assert rundir.recorded_end(tmp_path, 2) == TrialEnd(exit_status=killed, error=None)
    assert rundir.recorded_end(tmp_path, 3) is None, "an older attempt's end is not this one's"
    assert killed.describe() == "killed by SIGKILL"
    assert ExitStatus(exit_code=3, signal=None).describe() == "exited with code 3"


def test_a_missing_or_torn_record_reads_as_none(tmp_path: Path) -> None:
    assert rundir.recorded_leader(tmp_path) is None
    assert rundir.recorded_end(tmp_path, 1) is None
    assert rundir.recorded_stop(tmp_path) is None and rundir.last_heartbeat(tmp_path) is None
    (tmp_path / rundir.EXIT_RECORD).write_text('{"attempt": 1, "exit_co')
    assert rundir.recorded_end(tmp_path, 1) is None


def test_process_records_name_their_boot(tmp_path: Path) -> None:
    rundir.record_leader(tmp_path, pid=os.getpid(), started=123)
    leader = rundir.recorded_leader(tmp_path)
    assert leader is not None and (leader.pid, leader.started) == (os.getpid(), 123)
    assert leader.this_boot()
    assert not leader._replace(boot="another-boot").this_boot()
    assert leader._replace(boot=None).this_boot(), "records older than boot ids still count"


def test_the_stop_reason_and_the_heartbeat_are_read_back(tmp_path: Path) -> None:
    rundir.record_stop(tmp_path, "cancel\n")
    assert rundir.recorded_stop(tmp_path) == "cancel"
    rundir.touch_heartbeat(tmp_path)
    first = rundir.last_heartbeat(tmp_path)
    os.utime(tmp_path / rundir.HEARTBEAT, (0, 0))
    rundir.touch_heartbeat(tmp_path)
    last = rundir.last_heartbeat(tmp_path)
    assert first is not None and last is not None and last > 0
