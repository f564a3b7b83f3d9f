"""The cast of benchmarks/hostile.py: two real Linux users, the trials each submits, and the
processes those trials leave, found by the marker in their environment.

Every trial process carries HOSTILE_MARK=<run folder>/mark-<user>/<kind> in its environment
(inherited by whatever it forks or execs, in its process group or not), so that a census of
/proc finds the processes of one kind of trial, of one user, or of the whole run.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from soak import leftovers

from gpumux.home.accounts import UserAccount

# How long any process a trial starts may live, whatever becomes of the benchmark: even a
# process nothing stops ends by itself.
LONGEST_S = 600
MARK = "HOSTILE_MARK"

# The report flood: `rate` GPUMUX_REPORT lines a second for `seconds`, paced in 10 ms slices;
# `per_step` lines to a step, each line's loss its own index, so that the last value of step s
# is known: min((s + 1) * per_step, lines) - 1. Then what it did, to a file of its own.
REPORT_FLOOD = """
import json, os, sys, time
rate, seconds, per_step, done = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
lines = int(rate * seconds)
out = sys.stdout
began = time.monotonic()
written = 0
while written < lines:
    due = min(lines, int(rate * (time.monotonic() - began)) + rate // 100)
    out.write("".join(
        f'GPUMUX_REPORT {{"step": {i // per_step}, "loss": {i}}}\\n' for i in range(written, due)
    ))
    out.flush()
    written = due
    time.sleep(max(0.0, began + written / rate - time.monotonic()))
with open(done, "w") as record:
    json.dump({"lines": written, "seconds": time.monotonic() - began}, record)
"""

# The output flood: plain lines (not reports), as fast as they go, for `seconds`.
OUTPUT_FLOOD = """
import json, os, sys, time
seconds, done = float(sys.argv[1]), sys.argv[2]
block = b"".join(b"epoch %06d: a chatty library says nothing\\n" % i for i in range(1000))
began = time.monotonic()
written = 0
while time.monotonic() - began < seconds:
    written += os.write(1, block)
with open(done, "w") as record:
    json.dump({"bytes": written, "seconds": time.monotonic() - began}, record)
"""

# Escaping children: fork, setsid, fork again; the grandchild sleeps outside the trial's group.
ESCAPE = f"""
import os, time
child = os.fork()
if child == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", "{LONGEST_S}"])
    os._exit(0)
os.waitpid(child, 0)
print("a grandchild escaped to a session of its own", flush=True)
time.sleep({LONGEST_S})
"""

# A bounded fork bomb: `budget` processes below the trial's, a tree three wide, all asleep; a
# fork refused (a limit of the trial's) is printed, not retried.
FORK_BOMB = f"""
import os, sys, time
def grow(budget):
    for share in [budget // 3 + (k < budget % 3) for k in range(min(3, budget))]:
        try:
            pid = os.fork()
        except OSError as error:
            print(f"fork refused: {{error}}", flush=True)
            continue
        if pid == 0:
            grow(share - 1)
            time.sleep({LONGEST_S})
            os._exit(0)
grow(int(sys.argv[1]))
time.sleep({LONGEST_S})
"""


# The other user's trials: one report a second for $1 seconds, then exit 0.
WELL_BEHAVED = """i=0
while [ $i -lt $1 ]; do
    echo "GPUMUX_REPORT {\\"step\\": $i, \\"alive\\": 1}"
    sleep 1
    i=$((i + 1))
done
"""
SCRIPTS = {
    "report flood": ("report_flood.py", REPORT_FLOOD),
    "output flood": ("output_flood.py", OUTPUT_FLOOD),
    "escape": ("escape.py", ESCAPE),
    "fork bomb": ("fork_bomb.py", FORK_BOMB),
    "well-behaved": ("well_behaved.sh", WELL_BEHAVED),
}


@dataclass(frozen=True)
class User:
    """A throwaway Linux user and the directory its trials work in (its own, 0700)."""

    account: UserAccount
    workdir: Path

    @property
    def name(self) -> str:
        return self.account.name


@dataclass(frozen=True)
class Cast:
    """The run's folder, the hostile user and the well-behaved other user."""

    folder: Path
    hostile: User
    victim: User
    python: str
    split: int  # trials a node runs at once: room for every trial of both users

    def mark(self, user: User, kind: str = "") -> Path:
        """The marker of one kind of trial of `user` (of all its trials with no kind)."""
        role = "hostile" if user is self.hostile else "victim"
        return self.folder / f"mark-{role}" / kind

    def sweep(self, user: User, kind: str, argv: list[str], trials: int = 1) -> dict[str, Any]:
        """A sweep body: `trials` trials of the script of `kind` (in the user's directory, where
        it is written: a command's braces would be parameters) with `argv`, marked."""
        script = user.workdir / SCRIPTS[kind][0]
        script.write_text(SCRIPTS[kind][1])
        script.chmod(0o644)
        interpreter = ["/bin/sh"] if script.suffix == ".sh" else [self.python, "-I"]
        return {
            "name": kind,
            "command": [*interpreter, str(script), *argv],
            "workdir": str(user.workdir),
            "env": {"PATH": "/usr/bin:/bin", MARK: str(self.mark(user, kind))},
            "trials": trials,
            "split": self.split,
        }

    def done_file(self, kind: str) -> Path:
        """Where a flooding trial writes what it did (in the hostile user's directory)."""
        return self.hostile.workdir / f"{kind}.json"

    def fresh_done_file(self, kind: str) -> Path:
        """The done file, with what an earlier run (backend) wrote there removed."""
        done = self.done_file(kind)
        done.unlink(missing_ok=True)
        return done

    def report_flood(self, rate: int, seconds: float, per_step: int) -> dict[str, Any]:
        done = self.fresh_done_file("report flood")
        argv = [str(rate), str(seconds), str(per_step), str(done)]
        return self.sweep(self.hostile, "report flood", argv)

    def output_flood(self, seconds: float) -> dict[str, Any]:
        done = self.fresh_done_file("output flood")
        return self.sweep(self.hostile, "output flood", [str(seconds), str(done)])

    def escape(self) -> dict[str, Any]:
        return self.sweep(self.hostile, "escape", [])

    def fork_bomb(self, budget: int) -> dict[str, Any]:
        return self.sweep(self.hostile, "fork bomb", [str(budget)])

    def well_behaved(self, trials: int, seconds: int) -> dict[str, Any]:
        """The other user's trials: one report a second for `seconds` seconds, then exit 0."""
        return self.sweep(self.victim, "well-behaved", [str(seconds)], trials)


def census(mark: Path) -> dict[int, str]:
    """The live processes carrying `mark` (or below one that does): {pid: command line}."""
    return leftovers(mark)


def settle(mark: Path, timeout: float) -> dict[int, str]:
    """The processes carrying `mark` once none is left or `timeout` has passed."""
    deadline = time.monotonic() + timeout
    while (left := census(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def kill_all(pids: list[int]) -> None:
    """SIGKILL each of these processes (of this run); gone ones are no error."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def processes_of(uids: set[int]) -> list[int]:
    """The live processes running as one of these uids (real, effective or saved)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            fields = dict(
                line.split(":\t", 1)
                for line in Path(f"/proc/{entry.name}/status").read_text().splitlines()
                if ":\t" in line
            )
            if not fields["State"].startswith("Z") and uids & {
                int(uid) for uid in fields["Uid"].split()[:3]
            }:
                found.append(int(entry.name))
    return found


def runnable_python(account: UserAccount) -> str | None:
    """A Python 3 this user may run (the system's first: the venv may sit where they cannot)."""
    for python in ("/usr/bin/python3", os.path.realpath(sys.executable), sys.executable):
        try:
            done = subprocess.run(
                [python, "-I", "-c", "pass"],
                user=account.uid,
                group=account.gid,
                extra_groups=[],
                cwd="/",
                capture_output=True,
                timeout=60,
            )
        except (PermissionError, FileNotFoundError):
            continue
        if done.returncode == 0:
            return python
    return None


def make_cast(folder: Path, made: list[str], split: int) -> Cast:
    """Two system users (random names, appended to `made` as they are made) and their
    directories under `folder`, which every user may traverse; `split` trials to a node."""
    if os.geteuid() != 0 or not (shutil.which("useradd") and shutil.which("userdel")):
        raise SystemExit("benchmarks/hostile.py needs root, useradd and userdel: it makes users")
    folder.chmod(0o755)
    suffix = secrets.token_hex(3)
    users = []
    for role in ("hostile", "victim"):
        name = f"gmx_{role}_{suffix}"
        workdir = folder / f"work-{role}"
        command = ["useradd", "--system", "--no-create-home", "--home-dir", str(workdir)]
        subprocess.run([*command, "--shell", "/bin/sh", name], check=True, capture_output=True)
        made.append(name)
        account = UserAccount.from_name(name)
        workdir.mkdir(mode=0o700)
        os.chown(workdir, account.uid, account.gid)
        users.append(User(account=account, workdir=workdir))
    python = runnable_python(users[0].account)
    if python is None:
        raise SystemExit("no Python 3 that an ordinary user may run on this host")
    return Cast(folder=folder, hostile=users[0], victim=users[1], python=python, split=split)


def remove_users(names: list[str]) -> list[str]:
    """Kill every process of these users and delete them; the names userdel refused."""
    uids = set()
    for name in names:
        with contextlib.suppress(LookupError):
            uids.add(UserAccount.from_name(name).uid)
    deadline = time.monotonic() + 10
    while (pids := processes_of(uids)) and time.monotonic() < deadline:
        kill_all(pids)
        time.sleep(0.1)
    return [
        name
        for name in names
        if subprocess.run(["userdel", name], capture_output=True).returncode != 0
    ]
