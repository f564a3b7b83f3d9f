"""Schemathesis against a real `gpumux serve`: every check, from the daemon's own /openapi.json.

The daemon runs the commands of the sweeps it accepts. Where the suite has root, it runs as a
Linux user made for this module (useradd), its data directory its own, and commands stay
fuzzed; elsewhere it runs as the test's user and fuzz_hooks.py turns each command into
/bin/true. Two runs, bounded in cases, not time: one with a fixed seed, one with a random seed
that the failure message names (FUZZ_SEED=N replays it).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import select
import shutil
import signal
import site
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from reliability.conftest import DaemonProcess

import gpumux
from gpumux.home.accounts import UnknownUser, UserAccount
from gpumux.home.tokenfile import daemon_token

HOOKS = Path(__file__).with_name("fuzz_hooks.py")
FIXED_SEED = 14
# Each run's budget is a number of cases, where a time budget (--max-time) cut every phase to
# its share of the clock: the coverage phase sent 491 of its 930 boundary cases (PUT /profiles 9
# of 150, and missed its 500), the fuzzing phase one case of most operations. Without one, the
# coverage phase sends each of its cases, and fuzzing MAX_EXAMPLES of each operation's.
MAX_EXAMPLES = 20
# The coverage phase's cases are the same whatever the seed: the fixed-seed run sends them, the
# random-seed run only fuzzes (and runs the stateful phase's sequences of calls).
FIXED_PHASES = "examples,coverage,fuzzing,stateful"
RANDOM_PHASES = "examples,fuzzing,stateful"
# A run here takes about a minute; this is for a stuck one, under pytest's own 600 s.
RUN_TIMEOUT_S = 480
SEED_VARIABLE = "FUZZ_SEED"
# Where the daemon runs as its own account, the hooks leave commands fuzzed (fuzz_hooks.py reads
# it; not imported here, where importing the hooks would register them in pytest's process).
RUN_COMMANDS = "GPUMUX_FUZZ_RUN_COMMANDS"
# The CPU as the one device, two trials on it at a time; sweeps of at most 100 trials, so that
# what the fuzzer gets accepted stays cheap to store and run on a small CI machine.
DAEMON_ENV = {
    "CUDA_VISIBLE_DEVICES": "",
    "GPUMUX_CPU_SPLIT": "2",
    "GPUMUX_KILL_GRACE": "1",
    "GPUMUX_POLL_INTERVAL": "0.2",
    "GPUMUX_MAX_GRID": "100",
}
IMPORT_PATH = os.pathsep.join([str(Path(gpumux.__file__).parents[1]), *site.getsitepackages()])
# Ending the account's processes: rounds of SIGKILL (one may fork while the others die), and how
# long one killed process may take to exit.
KILL_ROUNDS = 5
EXIT_WAIT_S = 10.0
pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Confinement:
    """Who the daemon runs as: an account made for the test, or the test's user with hooks."""

    account: UserAccount | None
    python: str
    why: str


class ConfinedDaemon(DaemonProcess):
    """`gpumux serve` as the confinement's account (when it has one), in `base`."""

    def __init__(self, home: Path, confinement: Confinement) -> None:
        env = dict(DAEMON_ENV)
        if confinement.account is not None:
            user = confinement.account.name
            env |= {"HOME": str(home.parent), "USER": user, "LOGNAME": user}
            env |= {"PYTHONPATH": IMPORT_PATH}
        super().__init__(home, env=env)
        self.confinement = confinement
        self.python = confinement.python

    def spawn_options(self) -> dict[str, Any]:
        """As the account (uid, gid, no other groups), from a directory it may enter."""
        account = self.confinement.account
        if account is None:
            return {"cwd": self.home.parent}
        return {
            "cwd": self.home.parent,
            "user": account.uid,
            "group": account.gid,
            "extra_groups": [],
        }


def _python_for(account: UserAccount, cwd: Path) -> str | None:
    """A Python that `account` may run and that imports gpumux and its dependencies."""
    candidates = [sys.executable, os.path.realpath(sys.executable)]
    candidates.append(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    for python in dict.fromkeys(candidates):
        try:
            done = subprocess.run(
                [python, "-c", "import gpumux.main, gpumux.server.daemon"],
                user=account.uid,
                group=account.gid,
                extra_groups=[],
                env={"PATH": "/usr/bin:/bin", "PYTHONPATH": IMPORT_PATH},
                cwd=cwd,
                capture_output=True,
                timeout=60,
            )
        except (PermissionError, FileNotFoundError):
            continue
        if done.returncode == 0:
            return python
    return None


def _make_account(base: Path) -> UserAccount | str:
    """A system user made for the test, or why none could be made."""
    if os.geteuid() != 0:
        return "not root: the daemon runs as the test's user, each command made /bin/true"
    if missing := [tool for tool in ("useradd", "userdel") if not shutil.which(tool)]:
        return f"no {', '.join(missing)}: the daemon runs as root, each command made /bin/true"
    name = f"gmx_fuzz_{secrets.token_hex(3)}"
    command = ["useradd", "--system", "--no-create-home", "--home-dir", str(base)]
    subprocess.run([*command, "--shell", "/bin/sh", name], check=True, capture_output=True)
    return UserAccount.from_name(name)


def _runs_as(pid: int, uid: int) -> bool:
    """Whether process `pid` lives with `uid` as its real, effective or saved uid (as userdel
    counts it); a zombie has exited and holds no account."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    return not fields["State"].startswith("Z") and str(uid) in fields["Uid"].split()[:3]


def _processes_of(uid: int) -> list[int]:
    """The processes that run as `uid`, by pid."""
    return [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and _runs_as(int(p.name), uid)
    ]


def _end_processes_of(uid: int) -> list[int]:
    """SIGKILL each process that runs as `uid` and wait until it has exited; what is left."""
    for _ in range(KILL_ROUNDS):
        if not (pids := _processes_of(uid)):
            return []
        for pid in pids:
            try:
                process = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            try:
                # The pid is checked again through its pidfd: it may name another process now.
                if _runs_as(pid, uid):
                    signal.pidfd_send_signal(process, signal.SIGKILL)
                    select.select([process], [], [], EXIT_WAIT_S)  # readable once it exited
            except ProcessLookupError:
                pass
            finally:
                os.close(process)
    return _processes_of(uid)


def _remove_account(account: UserAccount) -> None:
    """Delete the account made for the test, once nothing runs as it; AssertionError if it stays."""
    left = _end_processes_of(account.uid)
    assert not left, f"processes {left} of {account.name} outlive SIGKILL: {account.name} is left"
    done = subprocess.run(["userdel", account.name], capture_output=True, text=True)
    assert done.returncode == 0, (
        f"userdel {account.name} failed (exit {done.returncode}): {done.stderr.strip()}"
    )


@pytest.fixture(scope="module")
def confinement() -> Iterator[tuple[Confinement, Path]]:
    """Who the daemon runs as, and a directory it may enter (0755) for its data."""
    base = Path(tempfile.mkdtemp(prefix="gpumux-fuzz-"))
    base.chmod(0o755)
    made = _make_account(base)
    try:
        if isinstance(made, str):
            yield Confinement(account=None, python=sys.executable, why=made), base
            return
        python = _python_for(made, base)
        if python is None:
            why = f"no Python that {made.name} may run imports gpumux: commands made /bin/true"
            yield Confinement(account=None, python=sys.executable, why=why), base
        else:
            why = f"the daemon runs as {made.name} (uid {made.uid}), commands fuzzed"
            yield Confinement(account=made, python=python, why=why), base
    finally:
        try:
            if not isinstance(made, str):
                _remove_account(made)
        finally:
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon(confinement: tuple[Confinement, Path]) -> Iterator[ConfinedDaemon]:
    """The daemon the fuzz runs of this module (of this worker, under xdist) use, its data
    directory (0700) its own."""
    who, base = confinement
    home = base / "home"
    home.mkdir(mode=0o700)
    if who.account is not None:
        os.chown(home, who.account.uid, who.account.gid)
    served = ConfinedDaemon(home, who)
    served.start()
    yield served
    served.close()


def _config(daemon: ConfinedDaemon, directory: Path) -> Path:
    """A schemathesis.toml (0600) with the daemon's token and the hooks."""
    lines = [
        f"headers = {{ Authorization = {json.dumps('Bearer ' + str(daemon_token(daemon.home)))} }}",
        f"hooks = {json.dumps(str(HOOKS))}",
        # A body over GPUMUX_MAX_BODY_BYTES is refused unparsed with a documented 413, whether
        # its content breaks the schema (schemathesis's default statuses for that leave 413 out)
        # or keeps it (a schema-valid sweep may hold more than 1 MiB of strings).
        "checks.negative_data_rejection.expected-statuses = "
        '["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", '
        '"5xx"]',
    ]
    # A sweep's rules across fields (a range's low end below its high end, a {name} that names a
    # parameter, a grid under GPUMUX_MAX_GRID, a pruner with an objective) are more than JSON
    # Schema can say: a schema-valid sweep may be refused with a documented 422. So may a
    # measured profile (its best N one of its curve's, each point's N of 1 or more, the device
    # one of the daemon's).
    for operation in ("POST /sweeps", "PUT /profiles"):
        lines += [
            "[[operations]]",
            f'include-name = "{operation}"',
            'checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "409", '
            '"413", "422", "429"]',
        ]
    path = directory / "schemathesis.toml"
    path.touch(mode=0o600)
    path.write_text("\n".join(lines) + "\n")
    return path


def _text(output: str | bytes | None) -> str:
    """A stuck run's output as far as it got (subprocess gives it as bytes once it timed out)."""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def _failures(output: str) -> str:
    """Schemathesis's failures (each with its curl reproduction) and summary, else its tail."""
    found = re.search(r"^=+ FAILURES =+$", output, re.MULTILINE)
    return output[found.start() :] if found else "\n".join(output.splitlines()[-80:])


def _random_seed(environ: Mapping[str, str]) -> int:
    return int(environ[SEED_VARIABLE]) if environ.get(SEED_VARIABLE) else secrets.randbelow(2**31)


def _assert_ran_confined(daemon: ConfinedDaemon) -> None:
    """The daemon runs as the account, or every command it was sent was made /bin/true."""
    account = daemon.confinement.account
    if account is not None:
        status = Path(f"/proc/{daemon.pid}/status").read_text()
        uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
        assert set(uids) == {str(account.uid)}, status
        return
    commands: set[tuple[str, ...]] = set()
    offset = 0
    with daemon.client() as client:
        while True:
            page = client.get("/sweeps", params={"offset": offset, "limit": 500})
            assert page.status_code == 200, page.text
            sweeps = page.json()["data"]
            commands |= {tuple(sweep["command"]) for sweep in sweeps}
            offset += len(sweeps)
            if not sweeps or offset >= page.json()["count"]:
                break
    assert commands <= {("/bin/true",)}, commands  # what fuzz_hooks.py sends


@pytest.mark.parametrize("seeded", ["fixed-seed", "random-seed"])
def test_the_api_keeps_its_schema_under_fuzzing(
    seeded: str, daemon: ConfinedDaemon, tmp_path: Path
) -> None:
    seed = FIXED_SEED if seeded == "fixed-seed" else _random_seed(os.environ)
    print(f"fuzzing with seed {seed}: {daemon.confinement.why}")
    command = [sys.executable, "-m", "schemathesis.cli", "--config-file"]
    command += [str(_config(daemon, tmp_path)), "--no-color", "run", f"{daemon.url}/openapi.json"]
    phases = FIXED_PHASES if seeded == "fixed-seed" else RANDOM_PHASES
    command += ["--checks", "all", "--seed", str(seed), "--phases", phases]
    command += ["--max-examples", str(MAX_EXAMPLES), "--workers", "1", "--request-timeout", "10"]
    command += ["--generation-database", "none"]
    env = {**os.environ, "COLUMNS": "120"}
    if daemon.confinement.account is not None:
        env[RUN_COMMANDS] = "1"  # the hooks leave commands as fuzzed
    again = f"pytest tests/server/test_fuzz.py -k {seeded}"
    replay = again if seeded == "fixed-seed" else f"{SEED_VARIABLE}={seed} {again}"
    try:
        done = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as stuck:
        pytest.fail(
            f"schemathesis ran past {RUN_TIMEOUT_S} s with seed {seed} (replay: {replay}); "
            f"its last output:\n{_text(stuck.stdout)[-2000:]}\n{_text(stuck.stderr)[-2000:]}\n"
            f"daemon:\n{daemon.log_tail()}",
            pytrace=False,
        )
    found = done.returncode  # named, so that pytest does not print the whole output twice
    assert found == 0, (
        f"schemathesis found failures with seed {seed} (replay: {replay}); "
        f"{daemon.confinement.why}\n"
        f"{_failures(done.stdout)}\n{done.stderr[-2000:]}\ndaemon:\n{daemon.log_tail()}"
    )
    assert daemon.running, f"the daemon exited under fuzzing\n{daemon.log_tail()}"
    daemon.health()
    # Read after the run: each parallel worker that runs a fuzz test has its own daemon.
    _assert_ran_confined(daemon)


@pytest.mark.skipif(
    os.geteuid() != 0 or not (shutil.which("useradd") and shutil.which("userdel")),
    reason="making an account needs root, useradd and userdel",
)
def test_the_account_goes_with_what_still_runs_as_it(tmp_path: Path) -> None:
    made = _make_account(tmp_path)
    assert isinstance(made, UserAccount), made
    left = subprocess.Popen(
        ["sleep", "600"], user=made.uid, group=made.gid, extra_groups=[], cwd="/"
    )
    try:
        _remove_account(made)
        assert left.wait(timeout=EXIT_WAIT_S) == -signal.SIGKILL
        with pytest.raises(UnknownUser):
            UserAccount.from_name(made.name)
    finally:
        left.kill()
        left.wait()
        if subprocess.run(["id", made.name], capture_output=True).returncode == 0:
            subprocess.run(["userdel", made.name], check=True)  # the test failed: clean up
