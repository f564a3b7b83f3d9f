from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from .conftest import DaemonProcess

SUBMITTERS = 50


def sweep_body(tmp_path: Path, number: int) -> dict[str, Any]:
    """A sweep of two instant trials, told apart from the others by its `n` constant."""
    return {
        "name": f"submission {number}",
        "params": ["x=1,2", f"n={number}"],
        "command": [sys.executable, "-c", "pass"],
        "workdir": str(tmp_path),
        "env": {"PATH": os.environ["PATH"]},
        # One trial at a time: the 2-core test machine stays free for the submissions.
        "split": 1,
    }


def test_fifty_concurrent_submissions_are_committed_before_they_are_acknowledged(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    start_together = threading.Barrier(SUBMITTERS)

    def submit(number: int) -> httpx.Response:
        with daemon.client(timeout=60) as client:
            start_together.wait()
            return client.post("/sweeps", json=sweep_body(tmp_path, number))

    with ThreadPoolExecutor(max_workers=SUBMITTERS) as pool:
        responses = list(pool.map(submit, range(SUBMITTERS)))
    daemon.kill9()

    assert [r.status_code for r in responses] == [201] * SUBMITTERS, [r.text for r in responses]
    acknowledged = {r.json()["id"]: r.json()["params"] for r in responses}
    assert len(acknowledged) == SUBMITTERS, "two submissions got one id"

    daemon.start()
    with daemon.client() as client:
        page = client.get("/sweeps", params={"limit": 500}).json()
        assert page["count"] == SUBMITTERS
        assert {sweep["id"]: sweep["params"] for sweep in page["data"]} == acknowledged
        for sweep_id, tokens in acknowledged.items():
            trials = client.get(f"/sweeps/{sweep_id}/trials").json()
            number = int(tokens[1].removeprefix("n="))
            assert [t["params"] for t in trials["data"]] == [
                {"x": 1, "n": number},
                {"x": 2, "n": number},
            ]
