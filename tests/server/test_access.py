"""Owner-only access through tokens, as root or not: users who are not admins, an admin by name,
and the users a daemon that is not root accepts.

The users are accounts this host already has (a token names a real account): alice and bob are
the first two besides root and whoever runs the tests, carol an admin by name, dave a user the
non-root daemon does not accept. The daemon runs as the tests do: as root it serves everyone,
otherwise GPUMUX_ACCEPT_USERS lets alice, bob and carol in; either way neither alice nor bob is
an admin. Sweeps are submitted over the API; no scheduler runs them.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from builders import bearer, served

from gpumux.config import Settings
from gpumux.home.accounts import UserAccount
from gpumux.server.api import create_app
from gpumux.storage.engine import Sessions

# Every user may enter it, so that a root daemon accepts it as anyone's working directory.
WORKDIR = "/"
# The routes that read or control one sweep or trial; {sweep} and {trial} are the owner's.
ROUTES = [
    ("GET", "/sweeps/{sweep}"),
    ("GET", "/sweeps/{sweep}/trials"),
    ("GET", "/trials/{trial}"),
    ("GET", "/trials/{trial}/log"),
    ("GET", "/trials/{trial}/reports"),
    ("POST", "/sweeps/{sweep}/cancel"),
]


@dataclass(frozen=True)
class Cast:
    """Accounts of this host that are neither root nor the user running the tests."""

    alice: UserAccount
    bob: UserAccount
    carol: UserAccount  # an admin by name (GPUMUX_ADMINS)
    dave: UserAccount  # not among the users a non-root daemon accepts
    eve: UserAccount  # the user a non-root daemon runs as, when the tests run as root


@pytest.fixture(scope="module")
def cast() -> Cast:
    """Five distinct accounts of this host, none of them root or the test's own user."""
    ours = {0, os.geteuid()}
    uids = sorted({entry.pw_uid for entry in pwd.getpwall()} - ours)
    if len(uids) < 5:
        pytest.skip(f"needs five accounts besides root and the test's user; this host has {uids}")
    accounts = [UserAccount.from_uid(uid) for uid in uids[:5]]
    return Cast(*accounts)


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cast: Cast) -> Settings:
    """Carol an admin by name; alice, bob and carol accepted should the daemon not be root."""
    monkeypatch.setenv("GPUMUX_ADMINS", cast.carol.name)
    accepted = ",".join(account.name for account in (cast.alice, cast.bob, cast.carol))
    monkeypatch.setenv("GPUMUX_ACCEPT_USERS", accepted)
    monkeypatch.delenv("GPUMUX_ADMIN_GROUP", raising=False)
    return Settings(home=tmp_path / "home")


@dataclass(frozen=True)
class Submitter:
    """A user's client of the daemon, the sweep they submitted, and its first trial."""

    account: UserAccount
    client: httpx.Client
    sweep: int
    trial: int

    def path(self, template: str) -> str:
        return template.format(sweep=self.sweep, trial=self.trial)

    def state(self) -> tuple[Any, Any]:
        """The sweep and its trials, as its owner sees them."""
        sweep = self.client.get(f"/sweeps/{self.sweep}")
        trials = self.client.get(f"/sweeps/{self.sweep}/trials")
        assert (sweep.status_code, trials.status_code) == (200, 200), (sweep.text, trials.text)
        return sweep.json(), trials.json()


@dataclass(frozen=True)
class Served:
    """The daemon's API as each user reaches it, and the times it nudged the scheduler."""

    alice: Submitter
    bob: Submitter
    carol: httpx.Client
    nudges: list[str]


def submit(client: httpx.Client) -> tuple[int, int]:
    """Submit a two-trial sweep; its id and its first trial's."""
    body = {"params": ["x=1,2"], "command": ["true"], "workdir": WORKDIR, "env": {}}
    created = client.post("/sweeps", json=body)
    assert created.status_code == 201, created.text
    sweep: int = created.json()["id"]
    trials = client.get(f"/sweeps/{sweep}/trials").json()["data"]
    return sweep, trials[0]["id"]


def client_of(base: httpx.Client, sessions: Sessions, account: UserAccount) -> httpx.Client:
    """A client of the same server carrying a fresh token of this user."""
    return httpx.Client(base_url=base.base_url, timeout=30, headers=bearer(sessions, account.name))


@pytest.fixture
def served_to(settings: Settings, sessions: Sessions, cast: Cast) -> Iterator[Served]:
    """The API on a real socket; alice and bob have each submitted a sweep through it."""
    nudges: list[str] = []
    app = create_app(settings=settings, sessions=sessions, notify=lambda: nudges.append("tick"))
    with (
        served(app) as base,
        client_of(base, sessions, cast.alice) as alice,
        client_of(base, sessions, cast.bob) as bob,
        client_of(base, sessions, cast.carol) as carol,
    ):
        alices, bobs = submit(alice), submit(bob)
        nudges.clear()
        yield Served(
            alice=Submitter(cast.alice, alice, *alices),
            bob=Submitter(cast.bob, bob, *bobs),
            carol=carol,
            nudges=nudges,
        )


def listed(client: httpx.Client, **params: str) -> list[tuple[int, str]]:
    """The (id, owner) of each sweep a GET /sweeps answers with (asserted 200)."""
    answer = client.get("/sweeps", params=params)
    assert answer.status_code == 200, answer.text
    page = answer.json()
    assert page["count"] == len(page["data"])
    return [(sweep["id"], sweep["owner"]) for sweep in page["data"]]


def test_each_user_lists_only_their_own_sweeps(served_to: Served) -> None:
    alice, bob = served_to.alice, served_to.bob
    assert listed(alice.client) == [(alice.sweep, alice.account.name)]
    assert listed(bob.client) == [(bob.sweep, bob.account.name)]
    assert listed(alice.client, owner=alice.account.name) == [(alice.sweep, alice.account.name)]
    for asker, owner in ((alice, bob), (bob, alice)):
        refused = asker.client.get("/sweeps", params={"owner": owner.account.name})
        assert refused.status_code == 403, refused.text
        assert refused.json()["detail"] == "the sweeps belongs to another user"


@pytest.mark.parametrize(("method", "route"), ROUTES)
def test_the_other_users_sweep_and_trials_answer_403_and_change_nothing(
    served_to: Served, method: str, route: str
) -> None:
    alice, bob = served_to.alice, served_to.bob
    for asker, owner in ((alice, bob), (bob, alice)):
        before = owner.state()
        refused = asker.client.request(method, owner.path(route))
        assert refused.status_code == 403, refused.text
        what = f"sweep {owner.sweep}" if "{sweep}" in route else f"trial {owner.trial}"
        assert refused.json()["detail"] == f"{what} belongs to another user"
        assert owner.state() == before
        assert served_to.nudges == []
    # The same request from its owner is served, and a cancel then changes what it shows and
    # nudges the scheduler: the refusals above were about who asked.
    before = bob.state()
    answer = bob.client.request(method, bob.path(route))
    assert answer.status_code == (202 if method == "POST" else 200), answer.text
    if method == "POST":
        assert bob.state()[0]["cancel_requested"] is True
        assert served_to.nudges == ["tick"]
    else:
        assert bob.state() == before


def test_an_admin_named_in_gpumux_admins_sees_and_reads_both(served_to: Served) -> None:
    alice, bob, carol = served_to.alice, served_to.bob, served_to.carol
    everyone = [(bob.sweep, bob.account.name), (alice.sweep, alice.account.name)]
    assert listed(carol) == everyone
    assert listed(carol, owner=alice.account.name) == [(alice.sweep, alice.account.name)]
    for owner in (alice, bob):
        for method, route in ROUTES:
            if method == "GET":
                answer = carol.get(owner.path(route))
                assert answer.status_code == 200, (route, answer.text)
        assert carol.get(owner.path("/sweeps/{sweep}")).json()["owner"] == owner.account.name


def test_a_name_finds_the_callers_own_sweep_even_for_an_admin(served_to: Served) -> None:
    alice, carol = served_to.alice, served_to.carol
    body = {"params": ["x=1"], "command": ["true"], "workdir": WORKDIR, "env": {}, "name": "quick"}
    alices = alice.client.post("/sweeps", json=body)
    assert alices.status_code == 201, alices.text
    # `gpumux cancel quick` by an admin must not reach alice's sweep of that name.
    assert listed(carol, name="quick") == []
    carols = carol.post("/sweeps", json=body)
    assert carols.status_code == 201, carols.text
    assert [id_ for id_, _ in listed(carol, name="quick")] == [carols.json()["id"]]
    assert listed(carol, name="quick", owner=alice.account.name) == [
        (alices.json()["id"], alice.account.name)
    ]
    digits = alice.client.post("/sweeps", json={**body, "name": "2024"})
    assert digits.status_code == 422 and "could not be told from sweep id 2024" in digits.text


def test_a_daemon_that_is_not_root_refuses_users_it_does_not_accept(
    sessions: Sessions, cast: Cast, tmp_path: Path
) -> None:
    settings = Settings(home=tmp_path / "home", admins="", accept_users=cast.alice.name)
    app = create_app(settings=settings, sessions=sessions)
    # The daemon runs as the test's user; as root, it stands in for one that runs as eve.
    daemon_uid = os.geteuid() or cast.eve.uid
    app.state.gpumux = dataclasses.replace(app.state.gpumux, daemon_uid=daemon_uid)
    daemon_user = pwd.getpwuid(daemon_uid).pw_name
    with (
        served(app) as base,
        client_of(base, sessions, UserAccount.from_uid(daemon_uid)) as own,
        client_of(base, sessions, cast.alice) as alice,
        client_of(base, sessions, cast.dave) as dave,
    ):
        owns, _ = submit(own)
        alices, _ = submit(alice)
        for method, path in (("GET", "/sweeps"), ("GET", f"/sweeps/{alices}"), ("GET", "/devices")):
            refused = dave.request(method, path)
            assert refused.status_code == 403, refused.text
            assert refused.json()["detail"] == (
                f"this gpumux daemon runs as {daemon_user} and does not serve {cast.dave.name}: "
                f"{daemon_user} can add {cast.dave.name} to GPUMUX_ACCEPT_USERS, or start your "
                "own daemon (gpumux serve)"
            )
        body = {"command": ["true"], "workdir": WORKDIR}
        assert dave.post("/sweeps", json=body).status_code == 403
        # Accepted is not admin: alice sees her own sweep only. The daemon's own user, an
        # admin, sees every sweep stored, and none of dave's.
        assert listed(alice) == [(alices, cast.alice.name)]
        assert listed(own) == [(alices, cast.alice.name), (owns, daemon_user)]
