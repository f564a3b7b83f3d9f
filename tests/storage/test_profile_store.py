"""Profiles in the store, and the windowed throughput reads the tuner measures with."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from builders import selects, sweep_plan
from pydantic import ValidationError
from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpumux.storage import owners as owner_store
from gpumux.storage import profiles as profile_store
from gpumux.storage import reports as report_store
from gpumux.storage import sweeps as sweep_store
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Profile, Sweep, Trial, TrialReport

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
CURVE = [
    {"split": 1, "throughput": 100.0, "seconds_per_trial": 10.0, "memory_per_trial_mb": 900.0},
    {"split": 2, "throughput": 180.0, "seconds_per_trial": 11.0, "memory_per_trial_mb": None},
]


def save(session: Session, **overrides: Any) -> Profile:
    fields: dict[str, Any] = dict(
        device_name="NVIDIA H200",
        fingerprint="f" * 64,
        command=["python", "train.py"],
        param_tokens=["bs=128"],
        unit="samples/s",
        curve=CURVE,
        best_split=2,
        settled=False,
        reason="raising N: +80% from 1 to 2",
        sweep_id=None,
    )
    fields.update(overrides)
    return profile_store.save_profile(session=session, **fields)


def make_sweep(session: Session, tmp_path: Path, trials: int = 1) -> Sweep:
    owner = owner_store.get_or_create_owner(session=session, name="alice")
    return sweep_store.create_sweep(
        session=session,
        plan=sweep_plan(tmp_path, seed=1, trial_params=[{} for _ in range(trials)]),
        owner=owner,
    )


def test_a_profile_round_trips_by_key_and_by_id(sessions: Sessions) -> None:
    with sessions.write.begin() as session:
        profile_id = save(session, curve=[{"split": 1, "throughput": 5}]).id
    with sessions.read() as session:
        by_key = profile_store.get_profile(
            session=session, device_name="NVIDIA H200", fingerprint="f" * 64
        )
        by_id = profile_store.get_profile_by_id(session=session, profile_id=profile_id)
        missing = profile_store.get_profile(
            session=session, device_name="CPU", fingerprint="f" * 64
        )
    assert by_key is not None and by_id is not None and by_key.id == by_id.id == profile_id
    assert missing is None
    assert by_id.curve == [
        {"split": 1, "throughput": 5.0, "seconds_per_trial": None, "memory_per_trial_mb": None}
    ]
    assert (by_id.command, by_id.param_tokens, by_id.unit) == (
        ["python", "train.py"],
        ["bs=128"],
        "samples/s",
    )
    assert by_id.best_split == 2 and by_id.settled is False
    assert by_id.reason == "raising N: +80% from 1 to 2"
    assert by_id.created_at.tzinfo is not None and by_id.updated_at == by_id.created_at


def test_saving_again_updates_the_profile_in_place(sessions: Sessions, tmp_path: Path) -> None:
    with sessions.write.begin() as session:
        first = save(session)
        first_id, created = first.id, first.created_at
    with sessions.write.begin() as session:
        sweep_id = make_sweep(session, tmp_path).id
        again = save(
            session, curve=CURVE[:1], best_split=1, settled=True, reason="knee", sweep_id=sweep_id
        )
    assert again.id == first_id
    with sessions.read() as session:
        profiles, count = profile_store.list_profiles(session=session)
    assert count == 1
    stored = profiles[0]
    assert stored.curve == CURVE[:1] and stored.best_split == 1 and stored.settled is True
    assert stored.sweep_id == sweep_id and stored.reason == "knee"
    assert stored.created_at == created and stored.updated_at > created


def test_one_profile_per_device_model_and_fingerprint(sessions: Sessions) -> None:
    with sessions.write.begin() as session:
        save(session)
        save(session, device_name="AMD EPYC 9654")
        save(session, fingerprint="e" * 64)
    with sessions.read() as session:
        assert profile_store.list_profiles(session=session)[1] == 3
    with pytest.raises(IntegrityError), sessions.write.begin() as session:
        session.add(
            Profile(
                device_name="NVIDIA H200",
                fingerprint="f" * 64,
                command=["x"],
                param_tokens=[],
                unit="samples/s",
                curve=[],
                settled=False,
            )
        )


def test_profiles_list_the_most_recently_updated_first(sessions: Sessions) -> None:
    with sessions.write.begin() as session:
        ids = [save(session, fingerprint=f"{n:064d}").id for n in range(4)]
    with sessions.write.begin() as session:
        save(session, fingerprint=f"{1:064d}", best_split=3)
    with sessions.read() as session:
        page, count = profile_store.list_profiles(session=session, offset=1, limit=2)
        everything, _ = profile_store.list_profiles(session=session)
    assert count == 4
    assert [p.id for p in everything] == [ids[1], ids[3], ids[2], ids[0]]
    assert [p.id for p in page] == [ids[3], ids[2]]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"unit": "batches/s"}, "unit 'batches/s'"),
        ({"curve": [{"split": 0, "throughput": 1.0}]}, "split"),
        ({"curve": [{"split": 1, "throughput": float("nan")}]}, "throughput"),
        ({"curve": [{"split": 1, "throughput": 1.0, "seconds_per_trial": 0}]}, "seconds"),
    ],
)
def test_a_profile_with_a_bad_unit_or_point_is_refused(
    sessions: Sessions, overrides: dict[str, Any], message: str
) -> None:
    with sessions.write.begin() as session:
        with pytest.raises((ValueError, ValidationError), match=message):
            save(session, **overrides)
        assert profile_store.list_profiles(session=session)[1] == 0


def test_deleting_the_measuring_sweep_keeps_the_profile(sessions: Sessions, tmp_path: Path) -> None:
    with sessions.write.begin() as session:
        sweep_id = make_sweep(session, tmp_path).id
        profile_id = save(session, sweep_id=sweep_id).id
    with sessions.write.begin() as session:
        session.execute(delete(Sweep).where(Sweep.id == sweep_id))
    with sessions.read() as session:
        profile = profile_store.get_profile_by_id(session=session, profile_id=profile_id)
        assert profile is not None and profile.sweep_id is None


def place(session: Session, sweep: Sweep, devices: list[str]) -> list[Trial]:
    trials = trial_store.list_trials(session=session, sweep_id=sweep.id)[0]
    for trial, device in zip(trials, devices, strict=True):
        trial.device = device
    return trials


def add_reports(session: Session, trial: Trial, samples: dict[float, float | None]) -> None:
    """Reports of `trial` at T0 + seconds, each with its samples."""
    session.add_all(
        TrialReport(
            trial_id=trial.id,
            attempt=1,
            kind="batch",
            at=T0 + timedelta(seconds=offset),
            samples=count,
            metrics={},
        )
        for offset, count in samples.items()
    )


def trials_at_split(session: Session, **window: Any) -> None:
    report_store.trials_at_split(session=session, device="cpu", split=2, since=window["start"])


def report_times(session: Session, **window: Any) -> None:
    report_store.report_times(session=session, trial_ids=[1, 3], **window)


@pytest.mark.sqlite_only(
    reason="EXPLAIN QUERY PLAN is SQLite's; PostgreSQL's planner picks by its statistics"
)
@pytest.mark.parametrize(
    ("read", "index"),
    [(trials_at_split, "ix_trials_ended_at"), (report_times, "ix_trial_reports_trial_id_id")],
)
def test_window_reads_search_an_index(
    sessions: Sessions, tmp_path: Path, read: Any, index: str
) -> None:
    with sessions.write.begin() as session:
        trials = place(session, make_sweep(session, tmp_path, 50), ["cpu", "gpu0"] * 25)
        for trial in trials:
            add_reports(session, trial, {float(n): 1.0 for n in range(20)})
    window = dict(start=T0, end=T0 + timedelta(seconds=10))
    with sessions.read() as session, selects(sessions) as statements:
        read(session, **window)
    assert len(statements) == 1
    statement, parameters = statements[0]
    with sessions.read() as session:
        plan = [
            row[-1]
            for row in session.connection().exec_driver_sql(
                f"EXPLAIN QUERY PLAN {statement}", parameters
            )
        ]
    assert not any(step.startswith("SCAN") for step in plan), plan
    assert any(index in step for step in plan), plan


def test_a_profile_keeps_the_n_that_ran_out_of_memory_and_a_lowered_ceiling(
    sessions: Sessions,
) -> None:
    with sessions.write.begin() as session:
        save(session, oom_at=8, ceiling=6)
    with sessions.write.begin() as session:
        profile = save(session, oom_at=5, ceiling=4)
        assert (profile.oom_at, profile.ceiling) == (5, 4)
    with sessions.read() as session:
        (stored,), _ = profile_store.list_profiles(session=session)
    assert (stored.oom_at, stored.ceiling) == (5, 4)


def test_the_similar_profile_is_the_newest_settled_one_of_the_same_command_and_device(
    sessions: Sessions,
) -> None:
    with sessions.write.begin() as session:
        older = save(session, fingerprint="a" * 16, settled=True, best_split=3).id
        newer = save(session, fingerprint="b" * 16, settled=True, best_split=5).id
        save(session, fingerprint="c" * 16, settled=False, best_split=None)
        save(session, fingerprint="d" * 16, settled=True, command=["python", "other.py"])
        save(session, fingerprint="e" * 16, settled=True, device_name="NVIDIA H100")
        # A settled profile updated again is the newest.
        save(session, fingerprint="a" * 16, settled=True, best_split=3)

    def similar(fingerprint: str) -> int | None:
        with sessions.read() as session:
            found = profile_store.similar_profile(
                session=session,
                device_name="NVIDIA H200",
                command=["python", "train.py"],
                fingerprint=fingerprint,
            )
            return None if found is None else found.id

    assert similar("z" * 16) == older
    # A workload's own profile is not similar to it.
    assert similar("a" * 16) == newer
    with sessions.read() as session:
        assert (
            profile_store.similar_profile(
                session=session,
                device_name="NVIDIA H200",
                command=["python", "train.py", "--deep"],
                fingerprint="z" * 16,
            )
            is None
        )
