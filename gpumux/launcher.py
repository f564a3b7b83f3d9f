"""Trial processes: spawn one in its own session with the trial contract, watch it, stop it."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shlex
import signal
import subprocess
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "runtime" / "bootstrap"
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
# Set per trial by the launcher; a submitter's own values must not leak into a trial.
CONTRACT_PREFIXES = ("GPUMUX_",)
CONTRACT_NAMES = ("CUDA_VISIBLE_DEVICES",)


class LaunchError(RuntimeError):
    """The trial could not be started; the message says why and how to fix it."""


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one attempt of one trial."""

    trial_id: int
    sweep_id: int
    attempt: int
    argv: Sequence[str]
    workdir: str
    base_env: Mapping[str, str]
    params: Mapping[str, Any]
    url: str
    token: str
    log_path: Path
    device_kind: str
    visible_device: str
    device_memory_mb: int | None
    split: int
    memory_limit_mb: int | None
    cpu_threads: int | None


@dataclass(frozen=True)
class ExitStatus:
    """How a process ended: its exit code, or the signal that killed it."""

    exit_code: int | None
    signal: int | None

    @classmethod
    def from_returncode(cls, returncode: int) -> ExitStatus:
        if returncode < 0:
            return cls(exit_code=None, signal=-returncode)
        return cls(exit_code=returncode, signal=None)

    def describe(self) -> str:
        if self.signal is not None:
            return f"killed by {signal.Signals(self.signal).name}"
        return f"exited with code {self.exit_code}"


def trial_env(spec: LaunchSpec) -> dict[str, str]:
    """The trial's environment: the submitter's, less gpumux's own names, plus the contract."""
    env = {
        name: value
        for name, value in spec.base_env.items()
        if not name.startswith(CONTRACT_PREFIXES) and name not in CONTRACT_NAMES
    }
    python_path = [str(BOOTSTRAP_DIR)]
    if env.get("PYTHONPATH"):
        python_path.append(env["PYTHONPATH"])
    env.update(
        PYTHONPATH=os.pathsep.join(python_path),
        PYTHONUNBUFFERED="1",
        GPUMUX_TRIAL_ID=str(spec.trial_id),
        GPUMUX_SWEEP_ID=str(spec.sweep_id),
        GPUMUX_ATTEMPT=str(spec.attempt),
        GPUMUX_PARAMS=json.dumps(dict(spec.params)),
        GPUMUX_URL=spec.url,
        GPUMUX_TRIAL_TOKEN=spec.token,
        GPUMUX_DEVICE_KIND=spec.device_kind,
        GPUMUX_SPLIT=str(spec.split),
        CUDA_VISIBLE_DEVICES=spec.visible_device,
    )
    if spec.memory_limit_mb is not None:
        env["GPUMUX_MEMORY_LIMIT_MB"] = str(spec.memory_limit_mb)
    if spec.device_memory_mb is not None:
        env["GPUMUX_DEVICE_MEMORY_MB"] = str(spec.device_memory_mb)
    if spec.cpu_threads is not None:
        env["GPUMUX_CPU_THREADS"] = str(spec.cpu_threads)
        env.update(dict.fromkeys(THREAD_VARIABLES, str(spec.cpu_threads)))
    return env


def process_start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot: with the pid, an identity."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    return int(stat.rpartition(")")[2].split()[19])


def group_members(pgids: Collection[int]) -> dict[int, int]:
    """Every live process in one of these process groups, mapped to its group."""
    members = {}
    wanted = set(pgids)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError):
            group = os.getpgid(int(entry.name))
            if group in wanted:
                members[int(entry.name)] = group
    return members


def signal_group(pgid: int, signum: int) -> bool:
    """Send a signal to a process group; False when the group is already gone."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True


class TrialProcess:
    """One running trial attempt: a process group led by the trial's command."""

    def __init__(self, popen: subprocess.Popen[bytes], spec: LaunchSpec) -> None:
        self.popen = popen
        self.spec = spec
        self.pid = popen.pid
        self.pgid = popen.pid
        self.start_ticks = process_start_ticks(popen.pid)
        self.pidfd = _pidfd_open(popen.pid)

    @classmethod
    def spawn(cls, spec: LaunchSpec) -> TrialProcess:
        """Start the trial in a new session with stdout and stderr appended to its log."""
        try:
            spec.log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            log_fd = os.open(spec.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as error:
            raise LaunchError(f"cannot write the trial's log {spec.log_path}: {error}") from error
        with open(log_fd, "ab") as log_file:
            try:
                log_file.write(
                    f"gpumux: trial {spec.trial_id} attempt {spec.attempt} on {spec.device_kind} "
                    f"split {spec.split}: {shlex.join(spec.argv)}\n".encode()
                )
                log_file.flush()
                popen = subprocess.Popen(
                    list(spec.argv),
                    cwd=spec.workdir,
                    env=trial_env(spec),
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
            except (OSError, ValueError) as error:
                raise LaunchError(_explain_spawn_error(error, spec)) from error
        log.info("trial %s: started pid %d: %s", spec.trial_id, popen.pid, shlex.join(spec.argv))
        return cls(popen, spec)

    def exited(self) -> bool:
        """Whether the leader has exited, without reaping it (its pid stays reserved)."""
        if self.popen.returncode is not None:
            return True
        try:
            result = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return result is not None

    def reap(self) -> ExitStatus:
        """Kill what is left of the group, then collect the leader's exit status."""
        # The unreaped leader pins the group id, so this cannot hit an unrelated group.
        signal_group(self.pgid, signal.SIGKILL)
        returncode = self.popen.wait()
        self.close()
        return ExitStatus.from_returncode(returncode)

    def terminate(self) -> None:
        """Ask the whole group to stop (SIGTERM)."""
        signal_group(self.pgid, signal.SIGTERM)

    def kill(self) -> None:
        """Stop the whole group now (SIGKILL)."""
        signal_group(self.pgid, signal.SIGKILL)

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def _pidfd_open(pid: int) -> int | None:
    # A pidfd turns readable when the process exits: the scheduler wakes on it instead of polling.
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _explain_spawn_error(error: OSError | ValueError, spec: LaunchSpec) -> str:
    program = spec.argv[0]
    if isinstance(error, ValueError):
        return f"could not start {program!r}: {error} (in its command, directory or environment)"
    if isinstance(error, FileNotFoundError) and error.filename == spec.workdir:
        return f"working directory {spec.workdir} does not exist"
    if isinstance(error, FileNotFoundError):
        path = spec.base_env.get("PATH", "")
        return f"command not found: {program!r} (searched PATH={path}); check the command"
    if isinstance(error, PermissionError) or error.errno == errno.EACCES:
        return f"permission denied running {program!r}: is it executable (chmod +x)?"
    return f"could not start {program!r}: {error}"


def tail_lines(path: Path | str | None, lines: int) -> str:
    """The last lines of a log file, or '' when there is none."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as log_file:
            size = log_file.seek(0, os.SEEK_END)
            log_file.seek(max(0, size - 64 * 1024))
            data = log_file.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-lines:])


def kill_orphans(trial_id: int, *, pgid: int, started: int) -> None:
    """SIGKILL what is left of a trial's process group after its daemon died.

    The leader may be gone while its children (data loaders, say) still hold the GPU. A member
    counts as the trial's only if it started no earlier than the leader: a group id freed and
    reused by an unrelated process since is left alone.
    """
    for pid in group_members({pgid}):
        ticks = process_start_ticks(pid)
        if ticks is not None and ticks >= started:
            log.warning("trial %s: pid %d outlived its daemon; killing it", trial_id, pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
