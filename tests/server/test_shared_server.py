"""The shared server (issue 6): a root daemon that real Linux users reach over its socket and TCP.

The users are made with useradd for this module and deleted after it. Their clients run as
them (tests/fixtures/uds_client.py, standard library only), so the daemon learns who asks
from the kernel (Unix socket) or from a token (TCP), never from what the request says.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
from reliability.conftest import DaemonProcess

from gpumux.home.accounts import UserAccount

if os.geteuid() != 0:
    pytest.skip(
        "needs root: it creates Linux users and runs a root daemon that runs trials as them",
        allow_module_level=True,
    )
if _missing := [
    tool for tool in ("useradd", "userdel", "groupadd", "groupdel") if not shutil.which(tool)
]:
    pytest.skip(f"needs {', '.join(_missing)} to create Linux users", allow_module_level=True)

FIXTURES = Path(__file__).parents[1] / "fixtures"
DEADLINE_S = 60.0
POLL_S = 0.2
SLOTS = 4
# The CPU as the one device on any host, four slots on it; trials stop fast when cancelled.
DAEMON_ENV = {
    "CUDA_VISIBLE_DEVICES": "",
    "GPUMUX_CPU_SPLIT": str(SLOTS),
    "GPUMUX_KILL_GRACE": "1",
    "GPUMUX_POLL_INTERVAL": "0.2",
}
# What a trial prints about the process it runs in, one key=value a line.
WHO_AM_I = (
    'echo "uid=$(id -u)"; echo "gid=$(id -g)"; echo "groups=$(id -G)"; echo "home=$HOME"; '
    'echo "user=$USER"; echo "logname=$LOGNAME"; echo "cwd=$(pwd)"'
)

T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = DEADLINE_S) -> T:
    """Poll `probe` until it returns something other than None; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while (value := probe()) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(POLL_S)
    return value


@dataclass(frozen=True)
class Via:
    """How a client reaches the daemon: its Unix socket, or TCP with a token (or none)."""

    unix: Path | None = None
    url: str | None = None
    token: str | None = None

    def client_args(self) -> list[str]:
        return ["--unix", str(self.unix)] if self.unix is not None else ["--url", str(self.url)]


@dataclass(frozen=True)
class Answer:
    """The daemon's answer to one request: its status and its JSON (or text) body."""

    status: int
    body: Any

    @property
    def detail(self) -> str:
        return str(self.body.get("detail")) if isinstance(self.body, dict) else str(self.body)


def request(method: str, path: str, body: Any = None) -> dict[str, Any]:
    """One request for uds_client.py."""
    return {"method": method, "path": path} | ({} if body is None else {"body": body})


@dataclass(frozen=True)
class User:
    """A throwaway Linux user, a Python it may run, and a directory only it may enter."""

    account: UserAccount
    python: str
    client: Path
    workdir: Path

    @property
    def name(self) -> str:
        return self.account.name

    def run(
        self, argv: list[str], *, env: Mapping[str, str] | None = None, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a command as this user (uid, gid and groups), in a login-like environment."""
        return subprocess.run(
            argv,
            user=self.account.uid,
            group=self.account.gid,
            extra_groups=list(self.account.groups),
            env={
                "PATH": "/usr/bin:/bin",
                "LANG": "C.UTF-8",
                "HOME": str(self.account.home),
                "USER": self.name,
                "LOGNAME": self.name,
                **(env or {}),
            },
            cwd="/",
            input=stdin,
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
        )

    def ask_all(self, via: Via, requests: list[dict[str, Any]]) -> list[Answer]:
        """Send the requests in order on one connection, as this user."""
        env = {"GPUMUX_TOKEN": via.token} if via.token else {}
        done = self.run(
            [self.python, "-I", str(self.client), *via.client_args()],
            env=env,
            stdin=json.dumps(requests),
        )
        assert done.returncode == 0, done.stderr
        return [Answer(answer["status"], answer["body"]) for answer in json.loads(done.stdout)]

    def ask(self, via: Via, method: str, path: str, body: Any = None) -> Answer:
        """Send one request as this user."""
        return self.ask_all(via, [request(method, path, body)])[0]

    def sweep(self, script: str, *, trials: int = 1, **fields: Any) -> dict[str, Any]:
        """A sweep body: `script` run by /bin/sh in this user's directory, four to a device."""
        return {
            "command": ["/bin/sh", "-c", script],
            "workdir": str(self.workdir),
            "env": {"PATH": "/usr/bin:/bin"},
            "trials": trials,
            "split": SLOTS,
            **fields,
        }


@dataclass(frozen=True)
class Cast:
    """The users of the shared server: two ordinary ones and two admins."""

    alice: User  # also in the group `team`, so that her trials have a supplementary group
    bob: User
    carol: User  # an admin by name (GPUMUX_ADMINS)
    dave: User  # an admin by group (GPUMUX_ADMIN_GROUP)
    team: str
    admins: str
    base: Path  # a directory every user can traverse


def _runs(python: str, account: UserAccount) -> bool:
    try:
        done = subprocess.run(
            [python, "-I", "-c", "pass"],
            user=account.uid,
            group=account.gid,
            cwd="/",
            capture_output=True,
            timeout=DEADLINE_S,
        )
    except (PermissionError, FileNotFoundError):  # none there, or a directory closed to them
        return False
    return done.returncode == 0


@pytest.fixture(scope="module")
def cast() -> Iterator[Cast]:
    """Users alice, bob, carol and dave (random suffixes) and their groups, deleted after."""
    suffix = secrets.token_hex(3)
    base = Path(tempfile.mkdtemp(prefix="gpumux-shared-"))
    base.chmod(0o755)
    (base / "home").mkdir(mode=0o755)
    client = base / "uds_client.py"
    shutil.copyfile(FIXTURES / "uds_client.py", client)
    client.chmod(0o644)
    team, admins = f"gmx_team_{suffix}", f"gmx_admins_{suffix}"
    groups_made: list[str] = []
    users_made: list[str] = []
    try:
        for group in (team, admins):
            subprocess.run(["groupadd", group], check=True, capture_output=True)
            groups_made.append(group)
        accounts: dict[str, UserAccount] = {}
        for role, extra in (("alice", team), ("bob", None), ("carol", None), ("dave", admins)):
            name = f"gmx_{role}_{suffix}"
            command = ["useradd", "--create-home", "--home-dir", str(base / "home" / name)]
            command += ["--shell", "/bin/sh"] + (["--groups", extra] if extra else [])
            subprocess.run([*command, name], check=True, capture_output=True)
            users_made.append(name)
            accounts[role] = UserAccount.from_name(name)
        pythons = [sys.executable, os.path.realpath(sys.executable), "/usr/bin/python3"]
        python = next((p for p in pythons if _runs(p, accounts["alice"])), None)
        if python is None:
            pytest.skip(f"no Python that an ordinary user may run among {pythons}")
        users = {}
        for role, account in accounts.items():
            workdir = base / f"work-{role}"
            workdir.mkdir(mode=0o700)
            os.chown(workdir, account.uid, account.gid)
            users[role] = User(account=account, python=python, client=client, workdir=workdir)
        yield Cast(**users, team=team, admins=admins, base=base)
    finally:
        failed = [
            name
            for name in users_made
            if subprocess.run(["userdel", name], capture_output=True).returncode != 0
        ]
        for group in groups_made:
            subprocess.run(["groupdel", group], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
        assert not failed, f"userdel failed for {failed}: a process of theirs still runs?"


class SharedDaemon(DaemonProcess):
    """`gpumux serve` as root on a Unix socket every user may open, and on TCP."""

    def __init__(self, home: Path, *, uds: Path, env: Mapping[str, str]) -> None:
        super().__init__(home, env={**DAEMON_ENV, **env}, uds=uds)
        self.socket = Via(unix=uds)

    def tcp(self, token: str | None = None) -> Via:
        """Its TCP address, with a token or without one."""
        return Via(url=self.url, token=token)

    def log_lines(self) -> list[str]:
        """What the daemon has logged so far."""
        return self.log_path.read_text(errors="replace").splitlines()

    def sweep_as_root(self, sweep_id: int) -> dict[str, Any]:
        """The sweep as root sees it (over TCP, with the daemon's own token)."""
        with self.client() as client:
            response = client.get(f"/sweeps/{sweep_id}")
        assert response.status_code == 200, response.text
        sweep: dict[str, Any] = response.json()
        return sweep

    def trials_as_root(self, sweep_id: int) -> list[dict[str, Any]]:
        """Every trial of the sweep, as root sees them."""
        with self.client() as client:
            response = client.get(f"/sweeps/{sweep_id}/trials", params={"limit": 1000})
        assert response.status_code == 200, response.text
        trials: list[dict[str, Any]] = response.json()["data"]
        return trials

    def wait_until_done(self, sweep_id: int) -> list[dict[str, Any]]:
        """Wait until the sweep has finished or was cancelled; its trials."""
        wait_for(
            lambda: (
                True
                if self.sweep_as_root(sweep_id)["status"] in ("finished", "cancelled")
                else None
            ),
            f"sweep {sweep_id} to end\n{self.log_tail()}",
        )
        return self.trials_as_root(sweep_id)


def start_daemon(root: Path, cast: Cast, env: Mapping[str, str]) -> SharedDaemon:
    """A started root daemon, its data in `root` (root only), its socket where all may go."""
    root.mkdir(mode=0o700, exist_ok=True)
    socket_dir = Path(tempfile.mkdtemp(dir=cast.base, prefix="sock-"))
    socket_dir.chmod(0o755)
    daemon = SharedDaemon(root / "home", uds=socket_dir / "gpumux.sock", env=env)
    daemon.start()
    return daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, cast: Cast) -> Iterator[SharedDaemon]:
    """The shared daemon most tests use: carol an admin by name, dave by group."""
    env = {"GPUMUX_ADMINS": cast.carol.name, "GPUMUX_ADMIN_GROUP": cast.admins}
    shared = start_daemon(tmp_path_factory.mktemp("shared"), cast, env)
    yield shared
    shared.close()


@pytest.fixture
def make_daemon(tmp_path: Path, cast: Cast) -> Iterator[Callable[[dict[str, str]], SharedDaemon]]:
    """Start a daemon of this test's own, with these settings; stopped after the test."""
    made: list[SharedDaemon] = []

    def make(env: dict[str, str]) -> SharedDaemon:
        made.append(start_daemon(tmp_path / str(len(made)), cast, env))
        return made[-1]

    yield make
    for each in made:
        each.close()


def submit(user: User, via: Via, body: dict[str, Any]) -> dict[str, Any]:
    """Submit a sweep as the user; the created sweep (asserted 201)."""
    answer = user.ask(via, "POST", "/sweeps", body)
    assert answer.status == 201, answer.body
    created: dict[str, Any] = answer.body
    return created


def key_values(text: str) -> dict[str, str]:
    """The key=value lines of a log."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_the_socket_is_open_to_every_user_and_the_data_to_root_alone(
    daemon: SharedDaemon,
) -> None:
    assert daemon.uds is not None
    assert stat.S_IMODE(daemon.uds.stat().st_mode) == 0o666
    assert stat.S_IMODE(daemon.home.stat().st_mode) == 0o700


def test_a_trial_runs_as_its_owner(cast: Cast, daemon: SharedDaemon) -> None:
    alice = cast.alice
    created = submit(alice, daemon.socket, alice.sweep(WHO_AM_I))
    assert created["owner"] == alice.name
    [trial] = daemon.wait_until_done(created["id"])
    assert trial["status"] == "succeeded", trial
    log = alice.ask(daemon.socket, "GET", f"/trials/{trial['id']}/log?offset=0")
    assert log.status == 200, log.body
    seen = key_values(log.body["data"])
    account = alice.account
    assert seen["uid"] == str(account.uid) != "0"
    assert seen["gid"] == str(account.gid) != "0"
    assert sorted(int(gid) for gid in seen["groups"].split()) == list(account.groups)
    assert len(account.groups) == 2  # her own group and `team`: supplementary groups are set
    assert seen["home"] == str(account.home) != os.path.expanduser("~root")
    assert seen["user"] == seen["logname"] == alice.name
    assert seen["cwd"] == str(alice.workdir)  # 0700, hers: entered as her


def test_users_see_and_control_only_their_own_sweeps(cast: Cast, daemon: SharedDaemon) -> None:
    alice, bob = cast.alice, cast.bob
    alices = submit(alice, daemon.socket, alice.sweep("echo started; exec sleep 60"))["id"]
    bobs = submit(bob, daemon.socket, bob.sweep("exec sleep 60"))["id"]

    def started() -> int | None:
        [trial] = daemon.trials_as_root(alices)
        return trial["id"] if trial["status"] == "running" else None

    trial_id = wait_for(started, "alice's trial to run")
    made = bob.ask(daemon.socket, "POST", "/tokens", {})
    assert made.status == 201, made.body
    assert made.body["user"] == bob.name
    intrusions = [
        request("GET", f"/sweeps/{alices}"),
        request("GET", f"/sweeps/{alices}/trials"),
        request("GET", f"/trials/{trial_id}"),
        request("GET", f"/trials/{trial_id}/log"),
        request("GET", f"/trials/{trial_id}/reports"),
        request("POST", f"/sweeps/{alices}/cancel"),
        request("GET", f"/sweeps?owner={alice.name}"),
    ]
    logged_before = len(daemon.log_lines())
    for via in (daemon.socket, daemon.tcp(made.body["token"])):
        *refused, listed = bob.ask_all(via, [*intrusions, request("GET", "/sweeps")])
        assert [answer.status for answer in refused] == [403] * len(intrusions), refused
        assert "belongs to another user" in refused[0].detail
        assert listed.status == 200, listed.body
        assert {sweep["owner"] for sweep in listed.body["data"]} == {bob.name}
        assert bobs in [sweep["id"] for sweep in listed.body["data"]]
    assert not daemon.sweep_as_root(alices)["cancel_requested"]
    # Each refusal is logged, naming bob and whose work he reached for.
    refusals = [
        line
        for line in daemon.log_lines()[logged_before:]
        if f"api: {bob.name} may not touch" in line
    ]
    assert len(refusals) == 2 * len(intrusions), refusals
    assert all(line.endswith(f" of {alice.name}") for line in refusals), refusals
    assert sum(f"sweep {alices} of" in line for line in refusals) == 2 * 3
    assert sum(f"trial {trial_id} of" in line for line in refusals) == 2 * 3

    own = alice.ask_all(
        daemon.socket,
        [request("GET", f"/sweeps/{alices}"), request("GET", f"/sweeps/{alices}/trials")]
        + [request("GET", f"/trials/{trial_id}"), request("GET", "/sweeps")],
    )
    assert [answer.status for answer in own] == [200] * 4, own
    assert own[0].body["owner"] == alice.name
    assert [trial["id"] for trial in own[1].body["data"]] == [trial_id]
    assert bobs not in [sweep["id"] for sweep in own[3].body["data"]]

    def logged() -> dict[str, Any] | None:
        answer = alice.ask(daemon.socket, "GET", f"/trials/{trial_id}/log")
        assert answer.status == 200, answer.body
        return answer.body if "started" in answer.body["data"] else None

    assert wait_for(logged, "alice's trial to log a line")["trial_id"] == trial_id

    for admin in (cast.carol, cast.dave):
        seen, one = admin.ask_all(
            daemon.socket, [request("GET", "/sweeps"), request("GET", f"/sweeps/{alices}")]
        )
        assert (seen.status, one.status) == (200, 200), (seen, one)
        assert {alices, bobs} <= {sweep["id"] for sweep in seen.body["data"]}, admin.name
    with daemon.client() as root:
        everyone = {sweep["id"] for sweep in root.get("/sweeps").json()["data"]}
    assert {alices, bobs} <= everyone

    # Alice cancels her sweep; an admin (by group) cancels bob's.
    for user, which in ((alice, alices), (cast.dave, bobs)):
        cancelled = user.ask(daemon.socket, "POST", f"/sweeps/{which}/cancel")
        assert cancelled.status == 202, (user.name, cancelled.body)
    for which in (alices, bobs):
        [trial] = daemon.wait_until_done(which)
        assert trial["status"] == "cancelled", trial


def test_an_owner_in_the_body_is_refused_and_a_forged_environment_is_overridden(
    cast: Cast, daemon: SharedDaemon
) -> None:
    alice, bob = cast.alice, cast.bob
    forged = bob.sweep(WHO_AM_I, owner=alice.name)
    refused = bob.ask(daemon.socket, "POST", "/sweeps", forged)
    assert refused.status == 422, refused.body
    assert ["body", "owner"] in [error["loc"] for error in refused.body["errors"]]
    # Claiming to be alice through the environment changes nothing either.
    claims = {"USER": alice.name, "LOGNAME": alice.name, "HOME": str(alice.account.home)}
    body = bob.sweep(WHO_AM_I)
    body["env"] |= claims
    created = submit(bob, daemon.socket, body)
    assert created["owner"] == bob.name
    [trial] = daemon.wait_until_done(created["id"])
    log = bob.ask(daemon.socket, "GET", f"/trials/{trial['id']}/log?offset=0")
    seen = key_values(log.body["data"])
    assert (seen["uid"], seen["user"], seen["home"]) == (
        str(bob.account.uid),
        bob.name,
        str(bob.account.home),
    )
    with daemon.client() as root:
        sweeps = root.get("/sweeps", params={"owner": alice.name}).json()["data"]
    assert created["id"] not in [sweep["id"] for sweep in sweeps]


def test_tcp_needs_a_live_token_and_tokens_are_made_over_the_socket(
    cast: Cast, daemon: SharedDaemon
) -> None:
    alice, bob = cast.alice, cast.bob
    made = subprocess.run(
        [sys.executable, "-m", "gpumux", "token", "create", bob.name]
        + ["--url", f"unix:{daemon.uds}"],
        env={k: v for k, v in os.environ.items() if not k.startswith("GPUMUX_")},
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert f"a token for {bob.name}" in made.stderr

    anonymous = bob.ask(daemon.tcp(), "GET", "/sweeps")
    assert anonymous.status == 401, anonymous.body
    assert "needs a token" in anonymous.detail
    wrong = bob.ask(daemon.tcp("not-a-token"), "GET", "/sweeps")
    assert wrong.status == 401, wrong.body
    assert "unknown or revoked" in wrong.detail
    accepted = bob.ask(daemon.tcp(token), "POST", "/sweeps", bob.sweep("true"))
    assert accepted.status == 201, accepted.body
    assert accepted.body["owner"] == bob.name

    # A token is made over the socket only, by its user (or an admin), not over TCP.
    over_tcp = bob.ask(daemon.tcp(token), "POST", "/tokens", {})
    assert over_tcp.status == 403, over_tcp.body
    assert "Unix socket" in over_tcp.detail
    for_alice, revoke_alice = bob.ask_all(
        daemon.socket,
        [
            request("POST", "/tokens", {"user": alice.name}),
            request("DELETE", f"/tokens/{alice.name}"),
        ],
    )
    assert (for_alice.status, revoke_alice.status) == (403, 403), (for_alice, revoke_alice)
    # Not even an admin: a token is the power to run code as its user (root's, above all).
    for admin in (cast.carol, cast.dave):
        for user in (alice.name, "root"):
            minted = admin.ask(daemon.socket, "POST", "/tokens", {"user": user})
            assert minted.status == 403, (admin.name, user, minted.body)
            assert "only root makes tokens for other users" in minted.detail

    revoked = bob.ask(daemon.socket, "DELETE", f"/tokens/{bob.name}")
    assert revoked.status == 200, revoked.body
    assert revoked.body["revoked"] >= 1
    after = bob.ask(daemon.tcp(token), "GET", "/sweeps")
    assert after.status == 401, after.body
    assert "unknown or revoked" in after.detail
    daemon.wait_until_done(accepted.body["id"])


def test_over_tcp_without_a_token_no_users_work_is_shown(cast: Cast, daemon: SharedDaemon) -> None:
    alice = cast.alice
    sweep_id = submit(alice, daemon.socket, alice.sweep("exec sleep 60"))["id"]
    try:
        wait_for(
            lambda: True if daemon.trials_as_root(sweep_id)[0]["status"] == "running" else None,
            "alice's trial to run",
        )
        # /devices lists the trials running on each device; /profiles, the commands of
        # measured workloads. The daemon itself says: over TCP every request needs a token.
        anonymous = alice.ask_all(
            daemon.tcp(), [request("GET", "/devices"), request("GET", "/profiles")]
        )
        assert [answer.status for answer in anonymous] == [401, 401], anonymous
    finally:
        with daemon.client() as root:
            assert root.post(f"/sweeps/{sweep_id}/cancel").status_code == 202
        daemon.wait_until_done(sweep_id)


@pytest.mark.parametrize("sealed", ["a 0700 directory of root", "an open one inside it"])
def test_a_working_directory_the_user_cannot_enter_is_refused(
    sealed: str, cast: Cast, daemon: SharedDaemon
) -> None:
    alice = cast.alice
    workdir = Path(tempfile.mkdtemp(dir=cast.base, prefix="sealed-"))  # 0700, root's
    if sealed == "an open one inside it":
        workdir = workdir / "inner"
        workdir.mkdir(mode=0o755)
    before = alice.ask(daemon.socket, "GET", "/sweeps").body["count"]
    refused = alice.ask(
        daemon.socket, "POST", "/sweeps", {**alice.sweep("true"), "workdir": str(workdir)}
    )
    assert refused.status == 403, refused.body
    assert f"{alice.name} cannot use the working directory" in refused.detail
    assert str(workdir) in refused.detail
    assert alice.ask(daemon.socket, "GET", "/sweeps").body["count"] == before


Span = tuple[datetime, datetime]


def spans(trials: list[dict[str, Any]]) -> list[Span]:
    """When each trial held its slot: from its start to its end."""
    return [
        (datetime.fromisoformat(trial["started_at"]), datetime.fromisoformat(trial["ended_at"]))
        for trial in trials
    ]


def average_held(held: list[Span], start: datetime, end: datetime) -> float:
    """The time-weighted mean number of these spans open over [start, end]."""
    overlap = sum(
        max(0.0, (min(stop, end) - max(begin, start)).total_seconds()) for begin, stop in held
    )
    return overlap / (end - start).total_seconds()


def most_at_once(held: list[Span]) -> int:
    """The largest number of these spans open at one moment."""
    # At equal times an end comes before a start: a slot freed and taken again is one slot.
    events = sorted([(begin, 1) for begin, _ in held] + [(stop, -1) for _, stop in held])
    most = current = 0
    for _, change in events:
        current += change
        most = max(most, current)
    return most


def test_fair_share_splits_the_slots_between_users(
    cast: Cast, make_daemon: Callable[[dict[str, str]], SharedDaemon]
) -> None:
    daemon = make_daemon({})
    alice, bob = cast.alice, cast.bob
    ids = {
        user.name: submit(user, daemon.socket, user.sweep("sleep 1", trials=20))["id"]
        for user in (alice, bob)
    }
    held = {name: spans(daemon.wait_until_done(sweep_id)) for name, sweep_id in ids.items()}
    assert all(len(user_spans) == 20 for user_spans in held.values())
    assert most_at_once([span for user_spans in held.values() for span in user_spans]) <= SLOTS
    # Both users had trials waiting from the later first start to the earlier last start.
    start = max(min(begin for begin, _ in user_spans) for user_spans in held.values())
    end = min(max(begin for begin, _ in user_spans) for user_spans in held.values())
    assert (end - start).total_seconds() > 2.0, (start, end)
    shares = {name: average_held(user_spans, start, end) for name, user_spans in held.items()}
    print(
        f"\nfair share over {(end - start).total_seconds():.2f} s with both queues full: "
        + ", ".join(f"{name} held {share:.2f} slots" for name, share in shares.items())
        + f" of {SLOTS} ({sum(shares.values()) / SLOTS:.0%} busy)"
    )
    for name, share in shares.items():
        assert share == pytest.approx(SLOTS / 2, abs=0.5), (name, shares)
    # Slots idle between trials cost both users alike: the shares stay close to each other.
    assert abs(shares[alice.name] - shares[bob.name]) < 0.25, shares


def test_per_user_limits_on_running_and_queued_trials(
    cast: Cast, make_daemon: Callable[[dict[str, str]], SharedDaemon]
) -> None:
    daemon = make_daemon({"GPUMUX_MAX_RUNNING_PER_USER": "1", "GPUMUX_MAX_QUEUED_PER_USER": "4"})
    alice, bob = cast.alice, cast.bob
    first, second = alice.ask_all(
        daemon.socket,
        [request("POST", "/sweeps", alice.sweep("sleep 0.5", trials=4))] * 2,
    )
    assert first.status == 201, first.body
    assert second.status == 429, second.body
    assert f"{alice.name} has" in second.detail
    assert "more would pass the limit of 4 (GPUMUX_MAX_QUEUED_PER_USER)" in second.detail
    too_many, taken = bob.ask_all(
        daemon.socket,
        [
            request("POST", "/sweeps", bob.sweep("sleep 0.5", trials=5)),
            request("POST", "/sweeps", bob.sweep("sleep 0.5", trials=4)),
        ],
    )
    assert too_many.status == 429, too_many.body
    assert f"{bob.name} has 0 trials waiting; 5 more" in too_many.detail
    assert taken.status == 201, taken.body
    held = {
        user.name: spans(daemon.wait_until_done(answer.body["id"]))
        for user, answer in ((alice, first), (bob, taken))
    }
    assert {name: most_at_once(user_spans) for name, user_spans in held.items()} == {
        alice.name: 1,
        bob.name: 1,
    }
    # The limit, not the four slots, held each to one: the two ran side by side.
    assert most_at_once(held[alice.name] + held[bob.name]) == 2


def test_concurrent_submissions_cannot_pass_the_queue_limit(
    cast: Cast, make_daemon: Callable[[dict[str, str]], SharedDaemon]
) -> None:
    # One trial of a user at a time: the queue holds the rest of an accepted sweep meanwhile.
    daemon = make_daemon({"GPUMUX_MAX_RUNNING_PER_USER": "1", "GPUMUX_MAX_QUEUED_PER_USER": "4"})
    alice = cast.alice
    sweeps = [request("POST", "/sweeps", alice.sweep("sleep 1", trials=4))] * 8
    done = alice.run(
        [alice.python, "-I", str(alice.client), "--parallel", "--unix", str(daemon.uds)],
        stdin=json.dumps(sweeps),
    )
    assert done.returncode == 0, done.stderr
    statuses = [answer["status"] for answer in json.loads(done.stdout)]
    with daemon.client() as root:
        waiting = root.get("/health").json()["queued_trials"]
        for sweep in root.get("/sweeps").json()["data"]:
            assert root.post(f"/sweeps/{sweep['id']}/cancel").status_code == 202
    assert sorted(statuses) == [201] + [429] * 7, f"{waiting} trials of alice waiting"
    assert waiting <= 4


def cli_as(user: User) -> list[str] | None:
    """How the user runs the gpumux CLI: this Python, or the same version of CPython that
    they may run with this environment's packages added; None when neither works."""
    paths = sysconfig.get_paths()
    site_dirs = sorted({paths["purelib"], paths["platlib"]})
    program = (
        f"import site; [site.addsitedir(d) for d in {site_dirs!r}]; "
        "from gpumux.main import main; main()"
    )
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for python in (sys.executable, f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        argv = [python, "-I", "-c", program]
        try:
            works = user.run([*argv, "--help"]).returncode == 0
        except (PermissionError, FileNotFoundError):
            continue
        if works:
            return argv
    return None


def test_a_user_makes_and_revokes_their_token_with_the_cli(
    cast: Cast, daemon: SharedDaemon
) -> None:
    alice = cast.alice
    gpumux = cli_as(alice)
    if gpumux is None:
        pytest.skip(
            f"{alice.name} can run no Python with gpumux's packages (checked above over the API)"
        )
    socket_url = ["--url", f"unix:{daemon.uds}"]
    made = alice.run([*gpumux, "token", "create", *socket_url])
    assert made.returncode == 0, made.stderr
    path = alice.account.home / ".config" / "gpumux" / "token"
    assert f"your token is in {path}" in made.stderr
    info = path.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (alice.account.uid, 0o600)
    token = path.read_text().strip()
    created = alice.ask(daemon.tcp(token), "POST", "/sweeps", alice.sweep("true"))
    assert created.status == 201, created.body
    assert created.body["owner"] == alice.name

    revoked = alice.run([*gpumux, "token", "revoke", *socket_url])
    assert revoked.returncode == 0, revoked.stderr
    assert f"revoked 1 tokens of {alice.name}" in revoked.stderr
    assert alice.ask(daemon.tcp(token), "GET", "/sweeps").status == 401
    daemon.wait_until_done(created.body["id"])
