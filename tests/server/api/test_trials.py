from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from builders import sweep_plan

from gpumux.processes.logfiles import RotatingLog
from gpumux.status import TrialStatus
from gpumux.storage import lifecycle
from gpumux.storage import owners as owner_store
from gpumux.storage import sweeps as sweep_store
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import token_hash


def running_trial(sessions: Sessions, tmp_path: Path, log_text: bytes = b"") -> int:
    log_path = tmp_path / "trial.log"
    log_path.write_bytes(log_text)
    with sessions.write.begin() as session:
        owner = owner_store.get_or_create_owner(session=session, name="alice")
        sweep = sweep_store.create_sweep(
            session=session,
            plan=sweep_plan(tmp_path, objective="loss:min", seed=1, trial_params=[{}]),
            owner=owner,
        )
        trial = trial_store.list_trials(session=session, sweep_id=sweep.id)[0][0]
        lifecycle.set_trial_status(
            session=session,
            trial=trial,
            status=TrialStatus.starting,
            token_hash=token_hash("tok"),
            log_path=str(log_path),
        )
        lifecycle.set_trial_status(session=session, trial=trial, status=TrialStatus.running)
        return trial.id


def test_the_log_tail_and_following_by_offset(
    api: httpx.Client, sessions: Sessions, tmp_path: Path
) -> None:
    trial_id = running_trial(sessions, tmp_path, b"line 1\nline 2\n")
    tail = api.get(f"/trials/{trial_id}/log").json()
    assert tail["data"] == "line 1\nline 2\n" and tail["next_offset"] == 14
    assert tail["complete"] is False
    with open(tmp_path / "trial.log", "ab") as log_file:
        log_file.write(b"line 3\n")
    more = api.get(f"/trials/{trial_id}/log", params={"offset": tail["next_offset"]}).json()
    assert more["data"] == "line 3\n" and more["offset"] == 14 and more["next_offset"] == 21


def test_a_chunk_never_splits_a_character(
    api: httpx.Client, sessions: Sessions, tmp_path: Path
) -> None:
    trial_id = running_trial(sessions, tmp_path, "ab€cd".encode())
    first = api.get(f"/trials/{trial_id}/log", params={"offset": 0, "limit": 3}).json()
    assert first["data"] == "ab" and first["next_offset"] == 2
    rest = api.get(f"/trials/{trial_id}/log", params={"offset": first["next_offset"]}).json()
    assert rest["data"] == "€cd"


def test_a_log_kept_in_more_than_nine_pieces_is_served_whole(
    api: httpx.Client, sessions: Sessions, tmp_path: Path
) -> None:
    trial_id = running_trial(sessions, tmp_path)
    log = RotatingLog(str(tmp_path / "trial.log"), max_bytes=100, keep=12)
    for number in range(52):  # eleven rotations (log_keep=12 drops none)
        log.write(f"line {number:04d}\n".encode())
    log.close()
    assert (tmp_path / "trial.log.11").exists()
    chunk = api.get(f"/trials/{trial_id}/log", params={"offset": 0}).json()
    assert (chunk["offset"], chunk["skipped"]) == (0, 0)
    served = ""
    while True:
        served += chunk["data"]
        if chunk["next_offset"] >= chunk["size"]:
            break
        chunk = api.get(f"/trials/{trial_id}/log", params={"offset": chunk["next_offset"]}).json()
    assert [line for line in served.splitlines() if line.startswith("line ")] == [
        f"line {number:04d}" for number in range(52)
    ]


def report(trial_id: int, attempt: int = 1) -> dict[str, object]:
    return {
        "trial_id": trial_id,
        "attempt": attempt,
        "kind": "epoch",
        "step": 0,
        "samples": 500,
        "seconds": 2,
        "metrics": {"loss": 0.25},
    }


def test_reports_need_the_trial_token(
    api: httpx.Client, sessions: Sessions, tmp_path: Path
) -> None:
    trial_id = running_trial(sessions, tmp_path)
    anonymous = {"Authorization": ""}
    assert api.post("/reports", json=report(trial_id), headers=anonymous).status_code == 401
    user_token = api.post("/reports", json=report(trial_id))
    assert user_token.status_code == 403, "a user's token is no trial's token"
    wrong = api.post("/reports", json=report(trial_id), headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 403 and "token does not match" in wrong.text
    stale = api.post("/reports", json=report(trial_id, 2), headers={"Authorization": "Bearer tok"})
    assert stale.status_code == 409 and "attempt 2" in stale.text
    unknown = api.post("/reports", json=report(424242), headers={"Authorization": "Bearer tok"})
    assert unknown.status_code == 404
    assert api.get(f"/trials/{trial_id}/reports").json()["count"] == 0

    good = api.post("/reports", json=report(trial_id), headers={"Authorization": "Bearer tok"})
    assert good.status_code == 204
    reports = api.get(f"/trials/{trial_id}/reports").json()
    assert reports["count"] == 1 and reports["data"][0]["samples_per_s"] == 250
    trial = api.get(f"/trials/{trial_id}").json()
    assert trial["objective"] == 0.25 and trial["samples_per_s"] == 250


def test_a_report_keeps_the_frameworks_pool_on_the_trial_until_another_tells_it(
    api: httpx.Client, sessions: Sessions, tmp_path: Path
) -> None:
    trial_id = running_trial(sessions, tmp_path)
    token = {"Authorization": "Bearer tok"}

    def pool() -> tuple[int | None, datetime | None]:
        with sessions.read() as session:
            trial = trial_store.get_trial(session=session, trial_id=trial_id)
            assert trial is not None
            return trial.pool_mb, trial.pool_at

    for refused in (-1, 1.5, "2048", 2**31):
        answer = api.post("/reports", json=report(trial_id) | {"pool_mb": refused}, headers=token)
        assert answer.status_code == 422 and "pool_mb" in answer.text, refused
    assert pool() == (None, None)
    assert api.post("/reports", json=report(trial_id) | {"pool_mb": 2048}, headers=token).is_success
    told, told_at = pool()
    assert told == 2048 and told_at is not None
    # A report without it leaves the pool, and when it was told, as they were.
    assert api.post("/reports", json=report(trial_id), headers=token).is_success
    assert pool() == (2048, told_at)
    assert api.post("/reports", json=report(trial_id) | {"pool_mb": 2048}, headers=token).is_success
    again, again_at = pool()
    assert again == 2048 and again_at is not None and again_at > told_at
    # When the runtime read it, never later than the report came.
    sent = report(trial_id) | {"pool_mb": 3072, "pool_at": again_at.timestamp() - 1.5}
    assert api.post("/reports", json=sent, headers=token).is_success
    read, read_at = pool()
    assert read == 3072 and read_at is not None
    assert abs(read_at - (again_at - timedelta(seconds=1.5))) < timedelta(milliseconds=1)
    ahead = report(trial_id) | {"pool_mb": 3072, "pool_at": time.time() + 3600}
    assert api.post("/reports", json=ahead, headers=token).is_success
    assert (latest := pool()[1]) is not None and latest <= datetime.now(UTC)
    negative = api.post("/reports", json=report(trial_id) | {"pool_at": -1}, headers=token)
    assert negative.status_code == 422
