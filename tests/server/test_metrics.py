from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from builders import ample_budget, served, stored_running_trial, sweep_plan
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from sqlalchemy.orm import Session

from gpumux.config import Settings
from gpumux.devices.snapshot import DeviceSnapshot
from gpumux.schemas.reports import ReportIn
from gpumux.server.api import create_app
from gpumux.server.metrics import DURATION_BUCKETS, MIB, QUEUE_WAIT_BUCKETS, TICK_BUCKETS, Metrics
from gpumux.status import TrialStatus
from gpumux.storage import lifecycle
from gpumux.storage import owners as owner_store
from gpumux.storage import reports as report_store
from gpumux.storage import sweeps as sweep_store
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Trial, utcnow

ROOT = Path(__file__).resolve().parents[2]
T0 = utcnow() - timedelta(hours=3)


def gpu(
    key: str,
    name: str,
    *,
    memory_total_mb: int | None = None,
    memory_used_mb: int | None = None,
    utilization_pct: int | None = None,
) -> DeviceSnapshot:
    return DeviceSnapshot(
        key=key,
        kind="gpu",
        index=int(key[-1]),
        name=name,
        uuid=None,
        memory_total_mb=memory_total_mb,
        memory_used_mb=memory_used_mb,
        memory_free_mb=None,
        utilization_pct=utilization_pct,
        processes=(),
        cpu_count=None,
    )


DEVICES = [
    gpu("gpu:0", "NVIDIA H200", memory_total_mb=143_771, memory_used_mb=20_480, utilization_pct=87),
    # A GPU whose fields NVML could not read: no memory or utilisation samples, its load still.
    gpu("gpu:1", "NVIDIA H200"),
]


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def scrape(
    settings: Settings, sessions: Sessions, metrics: Metrics
) -> Iterator[Callable[[], dict[str, list[Sample]]]]:
    """Scrape /metrics of an app that sees DEVICES; the samples by family name."""
    app = create_app(
        settings=settings, sessions=sessions, devices_view=lambda: DEVICES, metrics=metrics
    )
    with served(app) as client:

        def get() -> dict[str, list[Sample]]:
            response = client.get("/metrics")
            assert response.status_code == 200, response.text
            assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
            return {
                family.name: family.samples
                for family in text_string_to_metric_families(response.text)
            }

        yield get


@dataclass(frozen=True)
class Planned:
    """A trial to put in the database: its final status and times in seconds from T0."""

    status: TrialStatus
    started: float | None = None
    ended: float | None = None
    device: str | None = None
    split: int | None = None
    samples_per_s: float | None = None


PLANNED = [
    Planned(TrialStatus.succeeded, started=2, ended=102, device="gpu:0", split=2),
    Planned(TrialStatus.failed, started=40, ended=740, device="gpu:0", split=2),
    Planned(TrialStatus.lost, started=3, ended=20_003, device="gpu:1", split=1),
    Planned(TrialStatus.running, started=0.25, device="gpu:0", split=3, samples_per_s=120.5),
    Planned(TrialStatus.running, started=7, device="gpu:0", split=2, samples_per_s=79.5),
    Planned(TrialStatus.running, started=4000, device="gpu:1", split=4, samples_per_s=None),
    Planned(TrialStatus.starting, started=1200, device="gpu:1", split=5),
    # On a device the last probe did not list (it vanished): its load is still shown.
    Planned(TrialStatus.running, started=9, device="gpu:7", split=1, samples_per_s=5.0),
    Planned(TrialStatus.queued),
    # Ran once, then was cut off and waits again: its old start is not a queue wait.
    Planned(TrialStatus.queued, started=30),
    Planned(TrialStatus.cancelled, ended=50),
    Planned(TrialStatus.pruned, started=6, ended=65, device="gpu:0", split=2),
]


def at(seconds: float | None) -> datetime | None:
    return None if seconds is None else T0 + timedelta(seconds=seconds)


def insert(sessions: Sessions, tmp_path: Path, planned: list[Planned]) -> None:
    """One sweep holding a trial per plan, with the plan's times (queued at T0)."""
    with sessions.write.begin() as session:
        owner = owner_store.get_or_create_owner(session=session, name="alice")
        sweep = sweep_store.create_sweep(
            session=session,
            plan=sweep_plan(tmp_path, seed=1, trial_params=[{"n": n} for n in range(len(planned))]),
            owner=owner,
        )
        trials, _ = trial_store.list_trials(session=session, sweep_id=sweep.id)
        for trial, plan in zip(trials, planned, strict=True):
            advance(session, trial, plan)


def advance(session: Session, trial: Trial, plan: Planned) -> None:
    """Walk the trial through its lifecycle to the plan's status, at the plan's times."""
    trial.queued_at = T0
    if plan.started is None:
        if plan.status is TrialStatus.cancelled:
            lifecycle.set_trial_status(
                session=session, trial=trial, status=plan.status, ended_at=at(plan.ended)
            )
        return
    move = functools.partial(lifecycle.set_trial_status, session=session, trial=trial)
    move(
        status=TrialStatus.starting,
        started_at=at(plan.started),
        device=plan.device,
        split=plan.split,
    )
    if plan.status is TrialStatus.starting:
        return
    move(status=TrialStatus.running, samples_per_s=plan.samples_per_s)
    if plan.status is TrialStatus.queued:
        move(status=TrialStatus.queued, queued_at=at(plan.started + 60))
    elif plan.status.is_final:
        move(status=plan.status, ended_at=at(plan.ended))


def one(samples: list[Sample], **labels: str) -> float:
    found = [s.value for s in samples if s.labels == labels]
    assert len(found) == 1, (labels, samples)
    return found[0]


def histogram(samples: list[Sample]) -> tuple[dict[str, float], float, float]:
    """(cumulative count by `le`, count, sum) of an unlabelled histogram."""
    buckets = {s.labels["le"]: s.value for s in samples if s.name.endswith("_bucket")}
    count = next(s.value for s in samples if s.name.endswith("_count"))
    total = next(s.value for s in samples if s.name.endswith("_sum"))
    return buckets, count, total


def expected_buckets(observations: list[float], bounds: tuple[float, ...]) -> dict[str, float]:
    buckets = {str(float(b)): float(sum(o <= b for o in observations)) for b in bounds}
    return buckets | {"+Inf": float(len(observations))}


def test_an_empty_database_shows_every_state_at_zero(
    scrape: Callable[[], dict[str, list[Sample]]],
) -> None:
    families = scrape()
    assert {s.labels["state"]: s.value for s in families["gpumux_trials"]} == {
        state.value: 0 for state in TrialStatus
    }
    assert {s.labels["state"] for s in families["gpumux_sweeps"]} == {
        "queued",
        "running",
        "finished",
        "cancelled",
    }
    for name in ("gpumux_trial_queue_wait_seconds", "gpumux_trial_duration_seconds"):
        buckets, count, total = histogram(families[name])
        assert count == 0 and total == 0 and set(buckets.values()) == {0}
    samples = families["gpumux_device_split"]
    assert one(samples, device="gpu:0", name="NVIDIA H200") == 0
    assert one(samples, device="gpu:1", name="NVIDIA H200") == 0


def test_the_metrics_match_the_database(
    scrape: Callable[[], dict[str, list[Sample]]], sessions: Sessions, tmp_path: Path
) -> None:
    insert(sessions, tmp_path, PLANNED)
    families = scrape()

    by_state = {s.labels["state"]: s.value for s in families["gpumux_trials"]}
    assert by_state == {
        "queued": 2,
        "starting": 1,
        "running": 4,
        "succeeded": 1,
        "failed": 1,
        "cancelled": 1,
        "lost": 1,
        "pruned": 1,
    }
    assert one(families["gpumux_sweeps"], state="running") == 1

    waits = [
        p.started for p in PLANNED if p.started is not None and p.status is not TrialStatus.queued
    ]
    assert sorted(waits) == [0.25, 2, 3, 6, 7, 9, 40, 1200, 4000]
    buckets, count, total = histogram(families["gpumux_trial_queue_wait_seconds"])
    assert buckets == expected_buckets(waits, QUEUE_WAIT_BUCKETS)
    assert count == len(waits) and total == pytest.approx(sum(waits), abs=1e-3)

    durations = [p.ended - p.started for p in PLANNED if p.ended and p.started is not None]
    assert sorted(durations) == [59, 100, 700, 20_000]
    buckets, count, total = histogram(families["gpumux_trial_duration_seconds"])
    assert buckets == expected_buckets(durations, DURATION_BUCKETS)
    assert count == 4 and total == pytest.approx(20_859, abs=1e-3)

    h200 = {"name": "NVIDIA H200"}
    assert one(families["gpumux_device_memory_total_bytes"], device="gpu:0", **h200) == (
        143_771 * MIB
    )
    assert one(families["gpumux_device_memory_used_bytes"], device="gpu:0", **h200) == (
        20_480 * MIB
    )
    assert one(families["gpumux_device_utilization_ratio"], device="gpu:0", **h200) == 0.87
    for name in ("memory_total_bytes", "memory_used_bytes", "utilization_ratio"):
        devices = {s.labels["device"] for s in families[f"gpumux_device_{name}"]}
        assert devices == {"gpu:0"}, "an unreadable field is left out, not shown as 0"

    trials = families["gpumux_device_trials"]
    assert one(trials, device="gpu:0", **h200) == 2
    assert one(trials, device="gpu:1", **h200) == 2
    assert one(trials, device="gpu:7", name="") == 1
    rates = families["gpumux_device_samples_per_second"]
    assert one(rates, device="gpu:0", **h200) == 200
    assert one(rates, device="gpu:1", **h200) == 0
    assert one(rates, device="gpu:7", name="") == 5
    splits = families["gpumux_device_split"]
    assert one(splits, device="gpu:0", **h200) == 3
    assert one(splits, device="gpu:1", **h200) == 5


def test_the_scheduler_tick_histogram(
    scrape: Callable[[], dict[str, list[Sample]]], metrics: Metrics
) -> None:
    metrics.observe_tick(0.003)
    metrics.observe_tick(0.2)
    samples = scrape()["gpumux_scheduler_tick_seconds"]
    buckets, count, total = histogram(samples)
    assert count == 2 and total == pytest.approx(0.203)
    assert buckets == expected_buckets([0.003, 0.2], TICK_BUCKETS)


def test_one_metrics_serves_one_app(
    settings: Settings, sessions: Sessions, metrics: Metrics
) -> None:
    create_app(settings=settings, sessions=sessions, metrics=metrics)
    with pytest.raises(RuntimeError, match="already collect the state"):
        create_app(settings=settings, sessions=sessions, metrics=metrics)


def test_the_grafana_dashboard_queries_only_exported_metrics(
    scrape: Callable[[], dict[str, list[Sample]]], metrics: Metrics
) -> None:
    metrics.observe_tick(0.01)
    exported = {sample.name for samples in scrape().values() for sample in samples}
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "gpumux-dashboard.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bgpumux_\w+", target["expr"])
    }
    assert len(queried) >= 10 and queried <= exported, queried - exported
    sources = {target["datasource"]["uid"] for p in dashboard["panels"] for target in p["targets"]}
    assert sources == {"${DS_PROMETHEUS}"}


def test_absurd_reports_leave_every_metric_finite(
    sessions: Sessions, scrape: Callable[[], dict[str, list[Sample]]], tmp_path: Path
) -> None:
    with sessions.write.begin() as session:
        first = stored_running_trial(session, tmp_path, device="gpu:0", split=2)
        second = stored_running_trial(session, tmp_path, device="gpu:0", split=2)
        for trial_id, samples, seconds in ((first, 1e12, 1e-320), (second, 1e12, 1e-295)):
            trial = session.get(Trial, trial_id)
            assert trial is not None
            report_store.add_report(
                budget=ample_budget(),
                session=session,
                trial=trial,
                token="secret",
                report_in=ReportIn(
                    trial_id=trial_id, attempt=1, kind="batch", samples=samples, seconds=seconds
                ),
            )
        # And one stored before rates were checked.
        third = session.get(Trial, stored_running_trial(session, tmp_path, device="gpu:1"))
        assert third is not None
        third.samples_per_s = math.inf
    families = scrape()
    rates = families["gpumux_device_samples_per_second"]
    assert rates and all(math.isfinite(sample.value) for sample in rates)
