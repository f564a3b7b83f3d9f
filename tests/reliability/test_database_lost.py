"""The PostgreSQL server lost while a daemon runs a sweep, on a throwaway cluster of its own:
the daemon and its trials run on, /health answers 503, the log says the scheduler retries,
and once the server is back the sweep completes with nothing lost."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from postgres import Cluster, throwaway_cluster

from .conftest import DaemonFactory, DaemonProcess

TIMEOUT_S = 60.0
POLL_S = 0.05
FAST = {"GPUMUX_POLL_INTERVAL": "0.2", "GPUMUX_HEARTBEAT_INTERVAL": "0.2", "GPUMUX_CPU_SPLIT": "2"}


@pytest.fixture
def own_cluster() -> Iterator[Cluster]:
    """A cluster this test alone uses: it stops that server, which the shared one must not."""
    yield from throwaway_cluster("gpumux-pg-lost-")


def wait_until(what: str, check: Callable[[], object]) -> Any:
    """Poll `check` until it returns something true, for at most TIMEOUT_S."""
    deadline = time.monotonic() + TIMEOUT_S
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(POLL_S)
    return found


def trials_of(client: httpx.Client, sweep_id: int) -> list[dict[str, Any]]:
    page = client.get(f"/sweeps/{sweep_id}/trials")
    assert page.status_code == 200, page.text
    trials: list[dict[str, Any]] = page.json()["data"]
    return trials


def sweep_status(client: httpx.Client, sweep_id: int) -> str:
    answer = client.get(f"/sweeps/{sweep_id}")
    assert answer.status_code == 200, answer.text
    status: str = answer.json()["status"]
    return status


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_daemon_rides_out_its_database_server_going_away_and_loses_nothing(
    make_daemon: DaemonFactory, own_cluster: Cluster, tmp_path: Path
) -> None:
    url = own_cluster.url(own_cluster.create_database())
    daemon: DaemonProcess = make_daemon(env={"GPUMUX_DB": url, **FAST})
    release = tmp_path / "release"
    # Each trial runs until the test lets it end, so that it ends while the server is down.
    waiter = f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.05)"
    body = {
        "params": ["n=1,2"],
        "command": [sys.executable, "-c", waiter, "{n}"],
        "workdir": str(tmp_path),
        "env": {"PATH": os.environ["PATH"]},
    }
    with daemon.client() as client:
        created = client.post("/sweeps", json=body)
        assert created.status_code == 201, created.text
        sweep_id = created.json()["id"]
        running = wait_until(
            "both trials running",
            lambda: (
                [t for t in trials_of(client, sweep_id) if t["status"] == "running"][1:]
                and trials_of(client, sweep_id)
            ),
        )
        pids = [trial["pid"] for trial in running]

        own_cluster.halt()
        unhealthy = wait_until(
            "/health to answer 503", lambda: (h := client.get("/health")).status_code == 503 and h
        )
        assert url.split("@")[1].split("?")[0] in unhealthy.json()["detail"]
        wait_until(
            "the scheduler to say it retries",
            lambda: "is unreachable" in daemon.log_tail(200) and "retrying" in daemon.log_tail(200),
        )
        # The trials end while the server is down: their exits wait in their run directories.
        release.touch()
        wait_until("the trials to end", lambda: not any(alive(pid) for pid in pids))
        assert daemon.running and all(pid > 0 for pid in pids)

        own_cluster.resume()
        wait_until("/health to answer 200", lambda: client.get("/health").status_code == 200)
        wait_until("the sweep to finish", lambda: sweep_status(client, sweep_id) == "finished")
        ended = trials_of(client, sweep_id)
    assert sorted((t["status"], t["exit_code"], t["attempt"]) for t in ended) == [
        ("succeeded", 0, 1),
        ("succeeded", 0, 1),
    ]
    assert "the database is reachable again" in daemon.log_tail(400)
    assert "Traceback" not in daemon.log_tail(400)
    assert daemon.stop() == 0
