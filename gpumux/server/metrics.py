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

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

from gpumux.devices.snapshot import DeviceSnapshot
from gpumux.status import SweepStatus, TrialStatus
from gpumux.storage import stats
from gpumux.storage.engine import Sessions

MIB = 2**20

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
class StateCollector:
    """A custom collector: every value comes from the database or the devices at scrape time."""

    sessions: Sessions
    devices_view: Callable[[], list[DeviceSnapshot]]

    def collect(self) -> Iterator[Metric]:
        """The families of one scrape."""
        dialect = self.sessions.dialect
        with self.sessions.read() as session:
            trials = stats.trials_by_status(session=session)
            sweeps = stats.sweeps_by_status(session=session)
            waits = stats.queue_waits(session=session, dialect=dialect, bounds=QUEUE_WAIT_BUCKETS)
            durations = stats.run_durations(
                session=session, dialect=dialect, bounds=DURATION_BUCKETS
            )
            loads = stats.device_loads(session=session)
        yield states_family("gpumux_trials", "Trials in each state.", trials)
        yield states_family("gpumux_sweeps", "Sweeps in each state.", sweeps)
        yield histogram_family(
            "gpumux_trial_queue_wait_seconds",
            "Seconds from queued to started, per trial that started (latest attempt).",
            waits,
            QUEUE_WAIT_BUCKETS,
        )
        yield histogram_family(
            "gpumux_trial_duration_seconds",
            "Seconds from started to ended, per trial that ran and ended, whichever way.",
            durations,
            DURATION_BUCKETS,
        )
        yield from device_families(self.devices_view(), loads)


def states_family(
    name: str, documentation: str, counts: dict[TrialStatus, int] | dict[SweepStatus, int]
) -> GaugeMetricFamily:
    """A gauge per state, labelled with the state's value."""
    family = GaugeMetricFamily(name, documentation, labels=["state"])
    for state, count in counts.items():
        family.add_metric([state.value], count)
    return family


def histogram_family(
    name: str, documentation: str, histogram: stats.Histogram, bounds: Sequence[float]
) -> HistogramMetricFamily:
    """A Prometheus histogram of counts per bucket: cumulative, with its +Inf bucket."""
    family = HistogramMetricFamily(name, documentation, labels=[])
    cumulative = list(itertools.accumulate(histogram.counts))
    les = [str(float(bound)) for bound in bounds] + ["+Inf"]
    family.add_metric([], list(zip(les, cumulative, strict=True)), histogram.total)
    return family


def device_families(
    snapshots: list[DeviceSnapshot], loads: dict[str, stats.DeviceLoad]
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
        load = loads.get(device, stats.DeviceLoad())
        key = [device, names.get(device, "")]
        trials.add_metric(key, load.trials)
        if math.isfinite(load.samples_per_s):
            # A sum of rates stored before they were bounded may overflow: better none.
            rate.add_metric(key, load.samples_per_s)
        split.add_metric(key, load.split)
    yield from (total, used, utilization, trials, rate, split)
