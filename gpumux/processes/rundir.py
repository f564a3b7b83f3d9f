"""An attempt's run directory: the name and format of every file in it, written and read here.

The daemon writes the spec, the supervisor record and the stop reason; the supervisor writes
the leader record, the heartbeat and the exit record. Both sides go through this module, so
they agree on one format. The supervisor imports it once per trial attempt: it imports the
standard library alone, and little of it (no pathlib, no dataclasses, no logging).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from pathlib import Path

# What to run; written by the daemon before the supervisor starts.
SPEC = "spec.json"
# The supervisor's pid, start ticks and boot; written by the daemon before the trial starts.
SUPERVISOR_RECORD = "supervisor.json"
# The trial's leader (its pid is the group's id); written by the supervisor once it runs.
LEADER_RECORD = "trial.json"
# Touched by the supervisor at every heartbeat interval: its mtime says the supervisor lives.
HEARTBEAT = "heartbeat"
# Why gpumux stopped the attempt (a StopReason's value); written by the daemon.
STOP_REASON = "stop"
# How the attempt ended; written by the supervisor, durably, before it exits.
EXIT_RECORD = "exit.json"
# The supervisor's own stdout and stderr.
SUPERVISOR_LOG = "supervisor.log"
# The stop reason a supervisor records when it stops its trial because its node's lease lapsed.
LEASE_LAPSED = "lease"

Pathish = str | os.PathLike[str]


def attempt_dir(runs_dir: Path, trial_id: int, attempt: int) -> Path:
    """The run directory of one attempt of one trial: `runs/<trial>.<attempt>`."""
    return runs_dir / f"{trial_id}.{attempt}"


def write_json_atomically(path: Pathish, value: dict[str, Any], *, durable: bool = False) -> None:
    """Write a JSON file so that a reader sees the old file or the whole new one, never half;
    `durable`: also on disk before this returns (what must survive a power cut)."""
    folder, name = os.path.split(os.fspath(path))
    temporary = os.path.join(folder, f".{name}.{os.getpid()}")
    try:
        with open(temporary, "w") as out:
            json.dump(value, out)
            if durable:
                out.flush()
                os.fsync(out.fileno())
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    if durable:
        directory = os.open(folder or ".", os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def read_json(path: Pathish) -> dict[str, Any] | None:
    """A JSON object written atomically, or None when there is none (yet)."""
    try:
        with open(path) as json_file:
            value = json.load(json_file)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def boot_id() -> str:
    """This boot of the machine: pids and start ticks recorded in another boot name nothing."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            return boot.read().strip()
    except OSError:
        return ""


def boottime() -> float:
    """Seconds since this boot, counting suspends: one clock for the daemon and supervisors."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def write_lease(path: Pathish, *, until: float) -> None:
    """Record until when (boottime()) this host's node holds its lease on a shared database."""
    write_json_atomically(path, {"boot_id": boot_id(), "until": until})


def lease_until(path: Pathish) -> float:
    """Until when (boottime()) the node's lease recorded in `path` holds; 0 for no record, one
    of another boot or a malformed one: no node holds the trials of this host then."""
    record = read_json(path)
    if record is None or record.get("boot_id") != boot_id():
        return 0.0
    until = record.get("until")
    return float(until) if isinstance(until, int | float) else 0.0


def lease_lapsed(path: Pathish) -> bool:
    """Whether the node's lease recorded in `path` has lapsed."""
    return boottime() >= lease_until(path)


class ProcessRecord(NamedTuple):
    """A process as a run directory records it: its pid, its start ticks, its boot."""

    pid: int
    started: int | None
    boot: str | None

    def this_boot(self) -> bool:
        """Whether it was recorded in this boot of the machine (older records lack a boot)."""
        return self.boot in (None, boot_id())


# NamedTuples, not dataclasses: the supervisor imports this module, and dataclasses would add
# some 9 ms to the start of every trial.
class ExitStatus(NamedTuple):
    """How a process ended: its exit code, or the signal that killed it."""

    exit_code: int | None
    signal: int | None

    def describe(self) -> str:
        if self.signal is not None:
            return f"killed by {signal.Signals(self.signal).name}"
        return f"exited with code {self.exit_code}"


class TrialEnd(NamedTuple):
    """What a supervisor recorded: the exit status, or why the command never started."""

    exit_status: ExitStatus
    error: str | None


def write_spec(run_dir: Pathish, spec: dict[str, Any]) -> None:
    """Record what the supervisor is to run (see SupervisedTrial.spawn for its fields)."""
    write_json_atomically(os.path.join(run_dir, SPEC), spec)


def read_spec(run_dir: Pathish) -> dict[str, Any]:
    """What the supervisor is to run; OSError or ValueError when it cannot be read."""
    with open(os.path.join(run_dir, SPEC)) as spec_file:
        spec: dict[str, Any] = json.load(spec_file)
    return spec


def record_supervisor(run_dir: Pathish, *, pid: int, started: int | None) -> None:
    """Record the attempt's supervisor, so that a restarted daemon can find it again."""
    record = {"pid": pid, "started": started, "boot": boot_id()}
    write_json_atomically(os.path.join(run_dir, SUPERVISOR_RECORD), record)


def recorded_supervisor(run_dir: Pathish) -> ProcessRecord | None:
    """The attempt's supervisor as the daemon recorded it, if it did."""
    return _process_record(read_json(os.path.join(run_dir, SUPERVISOR_RECORD)), "pid")


def record_leader(run_dir: Pathish, *, pid: int, started: int | None) -> None:
    """Record the trial's leader, whose pid is its process group's id."""
    record = {"pid": pid, "pgid": pid, "started": started, "boot": boot_id()}
    write_json_atomically(os.path.join(run_dir, LEADER_RECORD), record)


def recorded_leader(run_dir: Pathish) -> ProcessRecord | None:
    """The trial's leader (pid = process group id) as its supervisor recorded it, if it did."""
    return _process_record(read_json(os.path.join(run_dir, LEADER_RECORD)), "pgid")


def _process_record(record: dict[str, Any] | None, pid_key: str) -> ProcessRecord | None:
    if record is None:
        return None
    started = record.get("started")
    return ProcessRecord(
        pid=int(record[pid_key]),
        started=None if started is None else int(started),
        boot=record.get("boot"),
    )


def touch_heartbeat(run_dir: Pathish) -> None:
    """Say that the supervisor lives; a full disk is no reason to stop it."""
    beat = os.path.join(run_dir, HEARTBEAT)
    try:
        os.utime(beat)
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            os.close(os.open(beat, os.O_WRONLY | os.O_CREAT, 0o600))


def last_heartbeat(run_dir: Pathish) -> float | None:
    """When the supervisor last beat (the file's mtime, as a marker); None before the first."""
    try:
        return os.stat(os.path.join(run_dir, HEARTBEAT)).st_mtime
    except FileNotFoundError:
        return None


def record_stop(run_dir: Pathish, reason: str) -> None:
    """Record why gpumux stops the attempt, for a daemon that adopts it or its end later."""
    with open(os.path.join(run_dir, STOP_REASON), "w") as stop_file:
        stop_file.write(reason)


def recorded_stop(run_dir: Pathish) -> str | None:
    """Why gpumux stopped the attempt, if it did."""
    try:
        with open(os.path.join(run_dir, STOP_REASON)) as stop_file:
            return stop_file.read().strip() or None
    except OSError:
        return None


def record_exit(
    run_dir: Pathish,
    *,
    trial_id: int,
    attempt: int,
    exit_status: ExitStatus,
    error: str | None,
    ended_at: float,
) -> None:
    """Record how the attempt ended, on disk before this returns (OSError on a full disk)."""
    record = {
        "trial_id": trial_id,
        "attempt": attempt,
        "exit_code": exit_status.exit_code,
        "signal": exit_status.signal,
        "error": error,
        "ended_at": ended_at,
    }
    write_json_atomically(os.path.join(run_dir, EXIT_RECORD), record, durable=True)


def recorded_end(run_dir: Pathish, attempt: int) -> TrialEnd | None:
    """The end of this attempt as its supervisor recorded it, if it did."""
    record = read_json(os.path.join(run_dir, EXIT_RECORD))
    if record is None or record.get("attempt") != attempt:
        return None
    exit_status = ExitStatus(exit_code=record["exit_code"], signal=record["signal"])
    return TrialEnd(exit_status=exit_status, error=record.get("error"))
