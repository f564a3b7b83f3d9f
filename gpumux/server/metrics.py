"""Prometheus metrics: the scheduler's tick time, and the state read from the database at scrape.

Trials by state and the per-device gauges are read when Prometheus scrapes, so they cannot go
stale. The queue-wait and duration histograms are cumulative over the whole database rather
than a recent window: they survive a daemon restart and they only grow, as a Prometheus
histogram must for `rate()` and `histogram_quantile()` to work, and PromQL bounds the window
(`rate(gpumux_trial_duration_seconds_bucket[1h])`). The price is two floats per trial read
at each scrape: a scrape took 0.25 s with 100,000 ended trials on these machines. Each trial
counts once, for its latest attempt: a requeued trial leaves the queue-wait histogram until it
starts again.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from sqlalchemy import ColumnElement, SQLColumnExpression, and_, case, func, select
from sqlalchemy.orm import Session

from gpumux.devices.probes import DeviceSnapshot
from gpumux.status import ACTIVE_TRIAL_STATUSES, FINAL_TRIAL_STATUSES, SweepStatus, TrialStatus
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Sweep, Trial

MIB = 2**20
SECONDS_PER_DAY = 86_400.0

TICK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
QUEUE_WAIT_BUCKETS = (0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600, 86400)
DURATION_BUCKETS = (1, 5, 10, 30, 60, 300, 600, 1800, 3600, 2 * 3600, 4 * 3600, 12 * 3600, 86400)


class Metrics:
    """gpumux's metrics in a registry of their own (no global one), served at /metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._tick = Histogram(
            "gpumux_scheduler_tick_seconds",
            "Time the scheduler took for one tick (reap, cancels, placement, launches).",
            buckets=TICK_BUCKETS,
            registry=self.registry,
        )
        self._state: StateCollector | None = None

    def observe_tick(self, seconds: float) -> None:
        """Record how long one scheduler tick took."""
        self._tick.observe(seconds)

    def collect_state(
        self, *, sessions: Sessions, devices_view: Callable[[], list[DeviceSnapshot]]
    ) -> None:
        """Read trials, sweeps and devices at every scrape; once: a second source would clash."""
        if self._state is not None:
            raise RuntimeError("these metrics already collect the state of a database")
        self._state = StateCollector(sessions=sessions, devices_view=devices_view)
        self.registry.register(self._state)


@dataclass(frozen=True)
class DeviceLoad:
    """What the trials that hold slots on one device add up to."""

    trials: int = 0
    samples_per_s: float = 0.0
    split: int = 0


@dataclass(frozen=True)
class StateCollector:
    """A custom collector: every value comes from the database or the devices at scrape time."""

    sessions: Sessions
    devices_view: Callable[[], list[DeviceSnapshot]]

    def collect(self) -> Iterator[Metric]:
        """The families of one scrape."""
        with self.sessions.read() as session:
            yield trials_by_state(session)
            yield sweeps_by_state(session)
            yield seconds_histogram(
                session,
                "gpumux_trial_queue_wait_seconds",
                "Seconds from queued to started, per trial that started (latest attempt).",
                start=Trial.queued_at,
                end=Trial.started_at,
                where=and_(Trial.status != TrialStatus.queued, Trial.started_at.is_not(None)),
                buckets=QUEUE_WAIT_BUCKETS,
            )
            yield seconds_histogram(
                session,
                "gpumux_trial_duration_seconds",
                "Seconds from started to ended, per trial that ran and ended, whichever way.",
                start=Trial.started_at,
                end=Trial.ended_at,
                where=and_(
                    Trial.status.in_(FINAL_TRIAL_STATUSES),
                    Trial.started_at.is_not(None),
                    Trial.ended_at.is_not(None),
                ),
                buckets=DURATION_BUCKETS,
            )
            loads = device_loads(session)
        yield from device_families(self.devices_view(), loads)


def trials_by_state(session: Session) -> GaugeMetricFamily:
    """Trials in each state, every state present."""
    counts = dict(session.execute(select(Trial.status, func.count()).group_by(Trial.status)).all())
    family = GaugeMetricFamily("gpumux_trials", "Trials in each state.", labels=["state"])
    for state in TrialStatus:
        family.add_metric([state.value], counts.get(state, 0))
    return family


def sweeps_by_state(session: Session) -> GaugeMetricFamily:
    """Sweeps in each state, every state present."""
    counts = dict(session.execute(select(Sweep.status, func.count()).group_by(Sweep.status)).all())
    family = GaugeMetricFamily("gpumux_sweeps", "Sweeps in each state.", labels=["state"])
    for state in SweepStatus:
        family.add_metric([state.value], counts.get(state, 0))
    return family


def seconds_histogram(
    session: Session,
    name: str,
    documentation: str,
    *,
    start: SQLColumnExpression[Any],
    end: SQLColumnExpression[Any],
    where: ColumnElement[bool],
    buckets: Sequence[float],
) -> HistogramMetricFamily:
    """A histogram of (end - start) in seconds over the trials matching `where`."""
    # Timestamps are stored as naive UTC text; julianday() reads them to ~50 microseconds.
    seconds = (func.julianday(end) - func.julianday(start)) * SECONDS_PER_DAY
    # Bucketed here rather than with a SUM(CASE ...) per bucket: SQLite would compute the
    # difference once per bucket and row, three times slower than fetching one float a row.
    in_bucket = [0] * (len(buckets) + 1)
    total = 0.0
    for value in session.scalars(select(seconds).where(where, end >= start)):
        in_bucket[bisect.bisect_left(buckets, value)] += 1
        total += value
    family = HistogramMetricFamily(name, documentation, labels=[])
    cumulative = list(itertools.accumulate(in_bucket))
    bounds = [str(float(bound)) for bound in buckets] + ["+Inf"]
    family.add_metric([], list(zip(bounds, cumulative, strict=True)), total)
    return family


def device_loads(session: Session) -> dict[str, DeviceLoad]:
    """Per device key: trials holding a slot (starting or running), their samples/s, the split."""
    rows = session.execute(
        select(
            Trial.device,
            func.count(),
            func.coalesce(
                func.sum(case((Trial.status == TrialStatus.running, Trial.samples_per_s))), 0.0
            ),
            func.coalesce(func.max(Trial.split), 0),
        )
        .where(Trial.status.in_(ACTIVE_TRIAL_STATUSES), Trial.device.is_not(None))
        .group_by(Trial.device)
    )
    return {
        device: DeviceLoad(trials=count, samples_per_s=float(rate), split=int(split))
        for device, count, rate, split in rows
    }


def device_families(
    snapshots: list[DeviceSnapshot], loads: dict[str, DeviceLoad]
) -> Iterator[GaugeMetricFamily]:
    """Memory and utilisation as last probed, and the load of gpumux's trials, per device."""
    labels = ["device", "name"]
    total = GaugeMetricFamily(
        "gpumux_device_memory_total_bytes", "Device memory in all.", labels=labels
    )
    used = GaugeMetricFamily(
        "gpumux_device_memory_used_bytes", "Device memory in use, by anyone.", labels=labels
    )
    utilization = GaugeMetricFamily(
        "gpumux_device_utilization_ratio",
        "Fraction of the last sample period the device was busy (NVML).",
        labels=labels,
    )
    trials = GaugeMetricFamily(
        "gpumux_device_trials",
        "Trials holding a slot on the device (starting or running).",
        labels=labels,
    )
    rate = GaugeMetricFamily(
        "gpumux_device_samples_per_second",
        "Sum of the samples/s last reported by the device's running trials.",
        labels=labels,
    )
    split = GaugeMetricFamily(
        "gpumux_device_split",
        "Trials at once on the device now (the largest split among them; 0 when idle).",
        labels=labels,
    )
    names = {snapshot.key: snapshot.name for snapshot in snapshots}
    for snapshot in snapshots:
        key = [snapshot.key, snapshot.name]
        if snapshot.memory_total_mb is not None:
            total.add_metric(key, snapshot.memory_total_mb * MIB)
        if snapshot.memory_used_mb is not None:
            used.add_metric(key, snapshot.memory_used_mb * MIB)
        if snapshot.utilization_pct is not None:
            utilization.add_metric(key, snapshot.utilization_pct / 100)
    # A device with trials that the last probe did not list still shows its load.
    for device in sorted(names.keys() | loads.keys()):
        load = loads.get(device, DeviceLoad())
        key = [device, names.get(device, "")]
        trials.add_metric(key, load.trials)
        rate.add_metric(key, load.samples_per_s)
        split.add_metric(key, load.split)
    yield from (total, used, utilization, trials, rate, split)
