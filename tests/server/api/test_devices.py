"""GET /devices: each device's mix of sweeps, their shares and the load, as each user sees it."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from builders import bearer, launched, served, stored_sweep
from pydantic import ConfigDict

from gpumux.config import Settings
from gpumux.devices.snapshot import DeviceSnapshot
from gpumux.home.accounts import UserAccount
from gpumux.schemas.devices import DevicePublic
from gpumux.server.api import create_app
from gpumux.server.api import devices as devices_api
from gpumux.server.api.deps import Caller
from gpumux.server.api.devices import node_devices, work_cores
from gpumux.status import TrialStatus
from gpumux.storage import lifecycle
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions

GPU = DeviceSnapshot(
    key="gpu0",
    kind="gpu",
    index=0,
    name="NVIDIA H200",
    uuid="GPU-0",
    memory_total_mb=143_771,
    memory_used_mb=45_000,
    memory_free_mb=98_771,
    utilization_pct=87,
    processes=(),
    cpu_count=None,
)
CPU = DeviceSnapshot(
    key="cpu",
    kind="cpu",
    index=0,
    name="the CPU",
    uuid=None,
    memory_total_mb=7_800,
    memory_used_mb=3_000,
    memory_free_mb=4_800,
    utilization_pct=None,
    processes=None,
    cpu_count=2,
)
# The user's own text: the API answers it as it is stored; the views show it as text.
ALICES_NAME = "<b>alice's</b> & lr"


@pytest.fixture(scope="module")
def users() -> tuple[UserAccount, UserAccount]:
    """Two accounts of this host that are neither root nor the test's own user."""
    uids = sorted({entry.pw_uid for entry in pwd.getpwall()} - {0, os.geteuid()})
    if len(uids) < 2:
        pytest.skip(f"needs two accounts besides root and the test's user; this host has {uids}")
    return UserAccount.from_uid(uids[0]), UserAccount.from_uid(uids[1])


@dataclass(frozen=True)
class Mixed:
    """The API as the test's user (an admin), alice and bob see it, and their sweeps' ids."""

    admin: httpx.Client
    alice: httpx.Client
    bob: httpx.Client
    alices: int
    bobs: int


def launch(sessions: Sessions, trial_id: int, device: str, slot: int, split: int) -> None:
    """Record a queued trial as holding `slot` of `device` at `split`, as a launch does."""
    with sessions.write.begin() as session:
        trial = trial_store.get_trial(session=session, trial_id=trial_id)
        assert trial is not None
        launched(session, trial, device=device, slot=slot, split=split)


@pytest.fixture
def mixed(
    tmp_path: Path, sessions: Sessions, users: tuple[UserAccount, UserAccount]
) -> Iterator[Mixed]:
    """Alice's sweep holds 2/3 of the GPU and 1/2 of the CPU, bob's 1/6 of the GPU; bob's
    other trial has ended and holds nothing."""
    alice, bob = users
    settings = Settings(home=tmp_path / "home", admins="", accept_users=f"{alice.name},{bob.name}")
    with sessions.write.begin() as session:
        alices = stored_sweep(session, tmp_path, 4, owner=alice.name, name=ALICES_NAME)
        bobs = stored_sweep(session, tmp_path, 2, owner=bob.name)
        alice_trials = [
            trial.id for trial in trial_store.list_trials(session=session, sweep_id=alices.id)[0]
        ]
        bob_trials = [
            trial.id for trial in trial_store.list_trials(session=session, sweep_id=bobs.id)[0]
        ]
        ids = (alices.id, bobs.id)
    launch(sessions, alice_trials[0], "gpu0", 0, 3)
    launch(sessions, alice_trials[1], "gpu0", 1, 3)
    launch(sessions, alice_trials[2], "cpu", 0, 2)
    launch(sessions, bob_trials[0], "gpu0", 2, 6)
    launch(sessions, bob_trials[1], "gpu0", 3, 6)
    with sessions.write.begin() as session:
        ended = trial_store.get_trial(session=session, trial_id=bob_trials[1])
        assert ended is not None
        lifecycle.set_trial_status(session=session, trial=ended, status=TrialStatus.running)
        lifecycle.set_trial_status(session=session, trial=ended, status=TrialStatus.succeeded)
    app = create_app(settings=settings, sessions=sessions, devices_view=lambda: [GPU, CPU])
    with served(app, bearer(sessions)) as admin:
        base = admin.base_url
        with (
            httpx.Client(base_url=base, headers=bearer(sessions, alice.name)) as as_alice,
            httpx.Client(base_url=base, headers=bearer(sessions, bob.name)) as as_bob,
        ):
            yield Mixed(admin, as_alice, as_bob, *ids)


def devices(client: httpx.Client) -> dict[str, dict[str, Any]]:
    response = client.get("/devices")
    assert response.status_code == 200, response.text
    return {device["key"]: device for device in response.json()}


def share(
    sweep_id: int, owner: str | None, name: str | None, split: int, trials: int
) -> dict[str, Any]:
    return dict(
        sweep_id=sweep_id, owner=owner, name=name, split=split, trials=trials, share=trials / split
    )


def test_an_admin_sees_every_sweep_of_the_mix_with_its_share_and_the_load(
    mixed: Mixed, users: tuple[UserAccount, UserAccount]
) -> None:
    alice, bob = users
    seen = devices(mixed.admin)
    assert seen["gpu0"]["mix"] == [
        share(mixed.alices, alice.name, ALICES_NAME, 3, 2),
        share(mixed.bobs, bob.name, None, 6, 1),
    ]
    assert seen["gpu0"]["load_fraction"] == "5/6"
    assert seen["gpu0"]["load"] == pytest.approx(5 / 6)
    assert len(seen["gpu0"]["trials"]) == 3, "the ended trial holds no slot"
    assert seen["cpu"]["mix"] == [share(mixed.alices, alice.name, ALICES_NAME, 2, 1)]
    assert seen["cpu"]["load_fraction"] == "1/2"
    # The cores that do the trials' work, as each device's kind says: the CPU's, none on a GPU.
    assert (seen["gpu0"]["work_cores"], seen["cpu"]["work_cores"]) == (None, 2)


def test_a_user_sees_whose_and_which_only_of_their_own_sweeps(
    mixed: Mixed, users: tuple[UserAccount, UserAccount]
) -> None:
    alice, bob = users
    # The ids and shares of others' sweeps, as the trials on a device already show their
    # sweeps' ids; not whose they are, nor their names, which the sweep's own route refuses.
    assert devices(mixed.alice)["gpu0"]["mix"] == [
        share(mixed.alices, alice.name, ALICES_NAME, 3, 2),
        share(mixed.bobs, None, None, 6, 1),
    ]
    assert devices(mixed.bob)["gpu0"]["mix"] == [
        share(mixed.alices, None, None, 3, 2),
        share(mixed.bobs, bob.name, None, 6, 1),
    ]
    assert mixed.alice.get(f"/sweeps/{mixed.bobs}").status_code == 403
    assert {device["load_fraction"] for device in devices(mixed.bob).values()} == {"5/6", "1/2"}


def test_a_sweep_whose_trials_run_at_two_splits_has_a_share_for_each(
    tmp_path: Path, settings: Settings, sessions: Sessions
) -> None:
    with sessions.write.begin() as session:
        sweep = stored_sweep(session, tmp_path, 6)
        trial_ids = [
            trial.id for trial in trial_store.list_trials(session=session, sweep_id=sweep.id)[0]
        ]
    # The split search moved from N=2 to N=4 while the first trial still ran: it holds 1/2, the
    # three launched after it 1/4 each.
    launch(sessions, trial_ids[0], "cpu", 0, 2)
    for slot, trial_id in enumerate(trial_ids[1:4], start=1):
        launch(sessions, trial_id, "cpu", slot, 4)
    app = create_app(settings=settings, sessions=sessions, devices_view=lambda: [CPU])
    with served(app, bearer(sessions)) as client:
        cpu = devices(client)["cpu"]
    assert [(entry["split"], entry["trials"]) for entry in cpu["mix"]] == [(2, 1), (4, 3)]
    assert [entry["share"] for entry in cpu["mix"]] == [0.5, 0.75]
    assert cpu["load_fraction"] == "5/4", "an over-full device says so"
    assert cpu["load"] == 1.25


def test_work_cores_is_said_only_where_the_kind_and_the_cores_are_known() -> None:
    assert (work_cores(CPU), work_cores(GPU)) == (2, None)
    # Another node's CPU, from its heartbeat, which carries no core count: not "1 cores".
    assert work_cores(replace(CPU, cpu_count=None)) is None
    # A newer node's kind this daemon does not know: listed, not a failed request.
    assert work_cores(replace(CPU, kind="shared-gpu")) is None


class StrictDevicePublic(DevicePublic):
    """DevicePublic refusing a field it has not, where the API's model ignores it."""

    model_config = ConfigDict(extra="forbid")


def test_a_device_is_built_from_the_fields_it_shows_none_dropped_unsaid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A snapshot's field that DevicePublic lacks would be dropped without a word: each one
    # left out must be left out where the device is built.
    monkeypatch.setattr(devices_api, "DevicePublic", StrictDevicePublic)
    snapshot = replace(CPU, cpu_cores=(0, 1))
    caller = Caller(account=UserAccount.from_uid(os.geteuid()), admin=False)
    [shown] = node_devices([snapshot], [], caller, node=None)
    assert (shown.key, shown.cpu_count, shown.memory_free_mb) == ("cpu", 2, 4_800)
