"""A real daemon starts a workload's split search from the database: where its own profile
settled, else where a similar workload settled."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from builders import daemon_bearer
from ports import free_port

from gpumux.config import Settings
from gpumux.devices.kinds import kind_of
from gpumux.devices.probes import make_probe
from gpumux.server.daemon import embedded
from gpumux.splits.curve import workload_fingerprint
from gpumux.storage import profiles as profile_store
from gpumux.storage.engine import make_engine, make_sessions
from gpumux.storage.migrate import upgrade

# The similar workload's best N: neither N=1 nor the CPU's guess (its cores), and under the
# CPU's ceiling of two trials per core.
SIMILAR_N = len(os.sched_getaffinity(0)) + 1
TRIAL = "import time; time.sleep(1.0)"


def device_model(settings: Settings) -> str:
    """The model the daemon keeps profiles per, for the first device its probe offers."""
    probe = make_probe(visible=settings.gpus)
    try:
        device = probe.snapshot()[0]
    finally:
        probe.close()
    return kind_of(device).model_name(device)


def save_similar_profile(
    settings: Settings,
    workdir: str,
    command: list[str],
    *,
    tokens: tuple[str, ...] = ("batch_size=64",),
    curve: tuple[int, ...] = (SIMILAR_N,),
) -> int:
    """A profile of the command with these cost parameters (by default another batch size than
    the sweeps'), settled at SIMILAR_N after measuring `curve`, in a fresh database."""
    settings.home.mkdir(parents=True)
    engine = make_engine(settings.database_url)
    try:
        upgrade(engine)
        with make_sessions(engine).write.begin() as session:
            profile = profile_store.save_profile(
                session=session,
                device_name=device_model(settings),
                fingerprint=workload_fingerprint([workdir, *command], list(tokens)),
                workdir=workdir,
                command=command,
                param_tokens=list(tokens),
                unit="trials/s",
                curve=[{"split": n, "throughput": float(n)} for n in curve],
                best_split=SIMILAR_N,
                settled=True,
                reason="knee",
                sweep_id=None,
            )
            return profile.id
    finally:
        engine.dispose()


def settings_in(tmp_path: Path) -> Settings:
    return Settings(
        home=tmp_path / "home",
        url=f"http://127.0.0.1:{free_port()}",
        poll_interval=0.2,
        split_settle=0.5,
        split_window=1.0,
    )


def run_auto_sweep(
    settings: Settings, workdir: str, command: list[str], trials: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A fresh daemon on the database runs a sweep of batch size 32 at auto: the sweep as it
    finished, and its trials."""
    with (
        embedded(settings) as daemon,
        httpx.Client(
            base_url=daemon.url, timeout=30, headers=daemon_bearer(settings.home)
        ) as client,
    ):
        created = client.post(
            "/sweeps",
            json={
                "params": ["batch_size=32", f"seed=1..{trials}"],
                "command": command,
                "workdir": workdir,
            },
        )
        assert created.status_code == 201, created.text
        sweep_id = created.json()["id"]
        assert created.json()["split"] == "auto"
        deadline = time.monotonic() + 120
        while (sweep := client.get(f"/sweeps/{sweep_id}").json())["status"] != "finished":
            assert time.monotonic() < deadline, f"sweep did not finish: {sweep}"
            time.sleep(0.2)
        rows = client.get(f"/sweeps/{sweep_id}/trials", params={"limit": 100}).json()["data"]
        assert {t["status"] for t in rows} == {"succeeded"}, rows
        return sweep, rows


def test_a_fresh_daemon_runs_a_workload_at_its_own_settled_profiles_n(tmp_path: Path) -> None:
    # As a daemon restarted between two sweeps of the workload finds it: no search in memory,
    # its profile in the database, settled at SIMILAR_N after measuring N=1 too (unsettled, the
    # search would go on from N=1, its lowest point).
    settings = settings_in(tmp_path)
    workdir = str(tmp_path.resolve())
    command = [sys.executable, "-c", TRIAL]
    own = save_similar_profile(
        settings, workdir, command, tokens=("batch_size=32",), curve=(1, SIMILAR_N)
    )

    sweep, trials = run_auto_sweep(settings, workdir, command, 2 * SIMILAR_N)

    assert {t["split"] for t in trials} == {SIMILAR_N}, trials
    (profile,) = sweep["profiles"]
    assert profile["id"] == own and profile["settled"], profile
    assert [p["split"] for p in profile["curve"]] == [1, SIMILAR_N], "nothing measured again"


def test_a_new_workload_starts_at_the_n_of_a_similar_workloads_profile(tmp_path: Path) -> None:
    settings = settings_in(tmp_path)
    workdir = str(tmp_path.resolve())
    command = [sys.executable, "-c", TRIAL]
    similar = save_similar_profile(settings, workdir, command)

    sweep, trials = run_auto_sweep(settings, workdir, command, 3 * SIMILAR_N)

    first = sorted(trials, key=lambda t: t["started_at"])[:SIMILAR_N]
    assert [t["split"] for t in first] == [SIMILAR_N] * SIMILAR_N, first
    (own,) = sweep["profiles"]
    assert own["id"] != similar and own["param_tokens"] == ["batch_size=32"]
    started = f"started at N={SIMILAR_N}: profile {similar} of a similar workload"
    assert started in own["reason"], own
    assert own["curve"][0]["split"] == SIMILAR_N, own
