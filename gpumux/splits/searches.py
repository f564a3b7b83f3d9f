"""Every split search of the daemon, one per device model and workload, and what they read of
the devices: the ceiling each searches under, and the memory the trials they measure hold."""

from __future__ import annotations

import logging
import os
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from fractions import Fraction
from functools import partial
from typing import NamedTuple

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from gpumux.config import Settings
from gpumux.devices.accounting import Overheads
from gpumux.devices.kinds import kind_of
from gpumux.devices.resident import resident_mb
from gpumux.devices.snapshot import DeviceSnapshot
from gpumux.fields import MAX_SPLIT
from gpumux.splits.curve import SEQUENCE
from gpumux.splits.mix import Mix, raised
from gpumux.splits.online import SplitSearch
from gpumux.splits.priors import resume_search
from gpumux.splits.window import Timing, sweep_fingerprint
from gpumux.status import SweepStatus
from gpumux.storage import profiles as profile_store
from gpumux.storage import trials as trial_store
from gpumux.storage.models import Sweep, Trial
from gpumux.storage.nodes import ThisNode

log = logging.getLogger(__name__)

# What NVML counts of a trial's process outside its memory slice, until measured: a CUDA context
# (728 MiB on the measured H200: 8,920 MiB shown for 8,192 allocated). Taken too large, a fit
# would run one N out of memory and back off; too small, it would stay one N below what fits.
# Where a workload's trials tell their frameworks' pools (PyTorch's), their context is measured
# (`_measure`): the fit subtracts it, and placement budgets it beside each of the workload's
# slices (`contexts`), as the fit does (docs/benchmarks.md, "The CUDA context, fitted by").
CONTEXT_MB = 728
# A context measured above this is a pool not told yet, not a context.
MAX_CONTEXT_MB = 2 * CONTEXT_MB


class SplitSearches:
    """Every split search of the daemon, one per (device model, workload), made on first need.

    A search measures on one device, the first of its model it was asked about, and its N
    serves every device of that model: two searches on twin GPUs would only race to write
    one profile.
    """

    def __init__(
        self,
        settings: Settings,
        overheads: Overheads | None = None,
        here: ThisNode | None = None,
    ) -> None:
        self.settings = settings
        # The node whose devices these are, on a database several nodes share: another
        # node's trials run on another machine's devices, whatever their keys.
        self.here = here or ThisNode()
        # The per-process overhead placement budgets with, so that the ceiling divides by the
        # same figure; a SplitSearches of its own (a tool, a test) measures none.
        self.overheads = (
            Overheads(configured_mb=settings.overhead_mb) if overheads is None else overheads
        )
        self.timing = Timing(
            settle=timedelta(seconds=settings.split_settle),
            window=timedelta(seconds=settings.split_window),
            threshold=settings.split_threshold,
            poll=timedelta(seconds=settings.poll_interval),
        )
        self._searches: dict[tuple[str, str], SplitSearch] = {}
        self._model_of: dict[str, str] = {}
        # Since when each search's first fit has waited for its trials' context (`_awaiting`);
        # the last reading of each trial (its process group) a context is measured from
        # (`_measure`), and the probes last looked at.
        self._awaited: dict[tuple[str, str], datetime] = {}
        self._readings: dict[int, Reading] = {}
        self._probes: dict[str, DeviceSnapshot] = {}
        # The context each workload's profile kept on each device model, read once
        # (`_stored_context`).
        self._stored: dict[tuple[str, str], int | None] = {}
        # The cores this daemon's trials run on: each GPU trial dispatches its kernels from one.
        self.host_cores = settings.host_cores or len(os.sched_getaffinity(0))

    def __iter__(self) -> Iterator[SplitSearch]:
        return iter(self._searches.values())

    def searched_splits(
        self, *, session: Session, sweep: Sweep, devices: Sequence[DeviceSnapshot]
    ) -> dict[str, int]:
        """The N the search chose for this sweep's workload on each device (auto sweeps)."""
        if sweep.split is not None or not self.settings.split_search:
            return {}
        return {
            device.key: self.search(session=session, sweep=sweep, device=device).split
            for device in devices
            if device.error is None
        }

    def search(self, *, session: Session, sweep: Sweep, device: DeviceSnapshot) -> SplitSearch:
        """The search for this sweep's workload on this device's model, made from the best
        prior on first need (see priors.resume_search)."""
        kind = kind_of(device)
        model = self._model_of[device.key] = kind.model_name(device)
        key = (model, sweep_fingerprint(sweep))
        if key not in self._searches:
            ceiling = self.ceiling(device)
            self._searches[key] = resume_search(
                session=session,
                device_key=device.key,
                device_name=model,
                workdir=sweep.workdir,
                command=list(sweep.command),
                param_tokens=sweep.param_tokens,
                ceiling=ceiling,
                timing=self.timing,
                guess=kind.first_split(device, ceiling, steps=SEQUENCE, cores=self.host_cores),
                cores=kind.work_cores(device),
                here=self.here,
            )
        return self._searches[key]

    def contexts(
        self, sweeps: Iterable[Sweep], *, session: Session, devices: Sequence[DeviceSnapshot]
    ) -> dict[tuple[str, int], int]:
        """By device and sweep, the CUDA context measured of the sweep's workload on the
        device's model; placement budgets it beside each of the sweep's trials' slices. Its
        auto sweep's search measures it (the search serves every device of the model; a fixed
        sweep of the workload runs the same processes); where none has been made since the
        daemon started (a fixed sweep, the running trials of a restarted daemon), the
        workload's profile there keeps what one measured (`_stored_context`)."""
        contexts = {}
        for sweep in {sweep.id: sweep for sweep in sweeps}.values():
            fingerprint = sweep_fingerprint(sweep)
            for device in (device for device in devices if device.error is None):
                model = kind_of(device).model_name(device)
                search = self._searches.get((model, fingerprint))
                context = (
                    self._stored_context(session, model, fingerprint)
                    if search is None
                    else search.context_mb
                )
                if context is not None:
                    contexts[(device.key, sweep.id)] = context
        return contexts

    def _stored_context(self, session: Session, model: str, fingerprint: str) -> int | None:
        """The CUDA context the workload's profile on the device model keeps (None: no
        profile, or none measured), read once: this daemon's own search of the workload
        measures any since; another node's raise of it is seen at the next restart."""
        key = (model, fingerprint)
        if key not in self._stored:
            profile = profile_store.get_profile(
                session=session, device_name=model, fingerprint=fingerprint
            )
            self._stored[key] = None if profile is None else profile.context_mb
        return self._stored[key]

    def observe(
        self,
        *,
        session: Session,
        now: datetime,
        waiting: Sequence[Sweep],
        devices: Sequence[DeviceSnapshot],
        group_of: Mapping[int, int],
    ) -> list[SplitSearch]:
        """After a tick's placements, let every unsettled search see its device, and every
        search measure its workload's CUDA context there (`_measure`).

        `waiting` are the sweeps of the trials next in line for slots, in their order;
        `devices` as last probed and `group_of` (our pids to their trial's process group) tell
        the memory each measured trial holds. Returns the searches whose curve, decision or
        context changed: their profiles need saving.
        """
        on = ActiveTrials.now(session=session, node_id=self.here.id)
        # The readings of trials that ended go with them.
        active = {pgid for pgids in on.groups.values() for pgid in pgids}
        self._readings = {pgid: r for pgid, r in self._readings.items() if pgid in active}
        queued = Counter(sweep_fingerprint(sweep) for sweep in waiting if sweep.split is None)
        workload = {
            sweep.id: sweep_fingerprint(sweep) if sweep.split is None else None for sweep in waiting
        }
        by_key = {device.key: device for device in devices}
        # The devices probed again since the last look: only their readings may have moved.
        fresh = {key for key, device in by_key.items() if self._probes.get(key) is not device}
        self._probes = by_key
        changed = []
        for (model, fingerprint), search in self._searches.items():
            device, context = search.device_key, search.context_mb
            if device in fresh:
                # Settled too: a newer framework or driver may hold more than its profile says.
                try:
                    self._measure(search, by_key.get(device), on, group_of, now=now)
                except Exception:
                    log.exception(
                        "device %s: the CUDA context of %s was not measured", device, fingerprint
                    )
            if search.decision.settled:
                timing = search.untimed and self._sweep_over(session, search)
                timed = timing and search.time_trials(session=session)
                if timed or search.context_mb != context:
                    changed.append(search)
                continue
            here = (search.device_key, fingerprint)
            free = 1 - on.shares[device]
            splits, snapshot = on.splits[here], by_key.get(device)
            stale = sum(n for split, n in splits.items() if split != search.split)
            # Other workloads share the device: the search goes on, by per-trial rates.
            mix = Mix(
                shares=on.shares[device],
                stale=stale,
                waiting=bool(waiting),
                fitting=any(self.share(model, sweep) <= free for sweep in waiting),
                reserved=any(
                    self.share(model, sweep) > free
                    for sweep in waiting
                    if workload[sweep.id] != fingerprint
                ),
                counted=len(waiting) < MAX_SPLIT,
                raised=snapshot is not None
                and kind_of(snapshot).raised_beside
                and raised(splits, split=search.split, shares=on.shares[device]),
            )
            before = (search.decision, len(search.curve), search.ceiling, context)
            measured = on.groups[(*here, search.split)]
            try:
                self._look(
                    search,
                    session=session,
                    now=now,
                    running=on.splits[here][search.split],
                    queued=queued[fingerprint],
                    mix=mix,
                    sweep_id=on.sweep_of.get(here, search.sweep_id or 0),
                    # What the trials under N hold: a lower N's, beside them in a raised
                    # phase, may hold more in their larger slices.
                    held=trial_memory(snapshot, measured, group_of),
                    snapshot=snapshot,
                    awaiting=partial(self._awaiting, search, measured, on, now=now),
                )
            except SQLAlchemyError:
                # The database failed, not the search: the session is spent, and the tick
                # that shares it fails and says so.
                raise
            except Exception:
                # One workload's search, whatever it read, must not stop the others or the tick:
                # it starts its phase again at the next tick.
                log.exception("device %s: the split search of %s failed", device, fingerprint)
                search.phase_start = search.filling_since = None
                continue
            over = not on.splits[here] and not queued[fingerprint]
            if over and self._sweep_over(session, search) and search.sweep_ended(session=session):
                changed.append(search)
            elif (search.decision, len(search.curve), search.ceiling, search.context_mb) != before:
                changed.append(search)
        return changed

    def _look(
        self,
        search: SplitSearch,
        *,
        session: Session,
        now: datetime,
        running: int,
        queued: int,
        sweep_id: int,
        held: list[int],
        snapshot: DeviceSnapshot | None,
        mix: Mix,
        awaiting: Callable[[], bool],
    ) -> None:
        """One search sees its device: the ceiling memory now allows, then its trials (what
        they hold fits no N while `awaiting` their CUDA context)."""
        if snapshot is not None and (bound := self.ceiling(snapshot)) < search.ceiling:
            # The overhead measured since the search began leaves room for fewer trials.
            search.lower_ceiling(
                bound,
                why=f"memory leaves room for at most {bound} trials",
                keep=kind_of(snapshot).stable_ceiling,
            )
        learning = search.probe is not None or (search.probed is not None and not search.curve)
        allocated = max(held, default=0) > self._context(search)
        deferred = False
        if snapshot is not None and learning and allocated:
            # The first wave's trials hold more than their CUDA context: they allocated, and
            # may still be allocating.
            deferred = awaiting()
            if not deferred:
                self._learn(search, snapshot, held=max(held))
        probe = search.probe
        search.observe(
            session=session,
            now=now,
            running=running,
            queued=queued,
            sweep_id=sweep_id,
            held=held,
            mix=mix,
        )
        if snapshot is not None and deferred and probe is not None and search.probe is None:
            # The wave's window closed while its fit waited for the context: it fits by what
            # is known, as it would have had the wait ended.
            self._learn(search, snapshot, held=max(held), wave=probe)
        if snapshot is None or search.decision.settled:
            return
        fit = self.memory_fit(snapshot, search)
        if fit is not None and fit < search.ceiling:
            search.lower_ceiling(
                fit,
                why=f"memory fits {fit} of the trials as they were seen holding it",
                keep=kind_of(snapshot).stable_ceiling,
            )

    @staticmethod
    def _context(search: SplitSearch) -> int:
        """The CUDA context of a trial of the search: measured, else `CONTEXT_MB`."""
        return CONTEXT_MB if search.context_mb is None else search.context_mb

    def _awaiting(
        self, search: SplitSearch, pgids: Sequence[int], on: ActiveTrials, *, now: datetime
    ) -> bool:
        """Whether the first wave's fit, its trials allocating, waits for their CUDA context:
        none is measured yet; they told their frameworks' pools, or none has reported yet (it
        may tell one); and it has waited less than a settle and a window. A ceiling once
        lowered stays, so a fit by the assumed context and the configured overhead, larger than
        most measured, would keep N below what fits; a context is measured two probes after
        a pool told (`_measure`)."""
        if search.context_mb is not None:
            return False
        told = any(pgid in on.pools for pgid in pgids)
        if not told and any(pgid in on.reported for pgid in pgids):
            # Their framework tells no pool (TensorFlow's, JAX's): none will be measured.
            return False
        since = self._awaited.setdefault((search.device_name, search.fingerprint), now)
        return now - since < self.timing.settle + self.timing.window

    def _learn(
        self, search: SplitSearch, device: DeviceSnapshot, *, held: int, wave: int | None = None
    ) -> None:
        """The first wave showed what a trial holds: the ceiling drops to what memory fits of
        it, and the search goes on from the N the device kind starts at where memory is known
        (`known_split`), if above its guess; until a point is measured, a larger reading lowers
        the ceiling (and that start) again."""
        wave = wave or search.probe or search.probed or search.split
        fit = self._fit(device, search, split=wave, held=held)
        if fit is not None and fit < search.ceiling:
            search.lower_ceiling(
                fit,
                why=f"memory fits {fit} of the trials as the first wave's held it",
                keep=kind_of(device).stable_ceiling,
            )
        # Memory is known where the trial held less than its slice (one that takes it whole,
        # as TensorFlow does, says nothing of what it needs).
        start = (
            None
            if fit is None
            else kind_of(device).known_split(search.ceiling, steps=SEQUENCE, cores=self.host_cores)
        )
        if search.probe is not None:
            search.learned(why=f"a trial at N={wave} holds {held} MiB", start=start)
        else:
            search.known(start)

    def memory_fit(self, device: DeviceSnapshot, search: SplitSearch) -> int | None:
        """The most trials whose slices would hold what the search's trials were seen holding,
        less their CUDA context (NVML's figure counts it; a slice caps the framework's
        allocations), never below an N measured; None where the device lists no memory per
        process or no measured trial held less than its slice (one that takes its whole slice,
        as TensorFlow does, would take any).

        Where memory, not the rate, bounds N (an 80 GB card and trials of 8 GiB), the climb
        then ends at the N that fits, not in N that run out of memory; it still measures the
        steps below it, where a peak of the rate may lie (docs/split-search-history.md: a skip
        straight to the fit, tried and reverted)."""
        fits = [
            fit
            for point in search.curve
            if point.memory_per_trial_mb is not None
            and (
                fit := self._fit(device, search, split=point.split, held=point.memory_per_trial_mb)
            )
            is not None
        ]
        return min(fits, default=None)

    def _fit(
        self, device: DeviceSnapshot, search: SplitSearch, *, split: int, held: float
    ) -> int | None:
        """The most trials whose slices hold what one of the search's trials held at N=`split`
        less its CUDA context (measured, else `CONTEXT_MB`), each with the overhead placement
        budgets beside its slice; never below `split`. None where the device lists no memory
        per process or the trial took its whole slice."""
        if not kind_of(device).lists_processes or device.memory_total_mb is None:
            return None
        room = device.memory_total_mb - self.settings.reserve_mb
        overhead = self.overheads.for_device(device.key, search.context_mb)
        if held >= room // split - overhead:
            return None
        return max(split, int(room // (max(1.0, held - self._context(search)) + overhead)))

    def _measure(
        self,
        search: SplitSearch,
        device: DeviceSnapshot | None,
        on: ActiveTrials,
        group_of: Mapping[int, int] | None,
        *,
        now: datetime,
    ) -> None:
        """Measure the CUDA context of the search's trials on its device, probed again since the
        last look: what NVML says a trial's one process holds less what its framework last said
        its pool holds: the largest so measured is the workload's (`SplitSearch.context_mb`,
        kept in its profile), which the fit subtracts and placement budgets beside each of its
        trials' slices (`contexts`).

        Only by the pool the look before this one saw, where it was read (`Pool.told`) after
        the first look at NVML's figure and the figure held still from that look's probe to
        this one's (three probes or more): the pool is then what the framework held while NVML
        showed the figure. The pool moves as the framework allocates or frees (PyTorch's
        `empty_cache`), and NVML's figure with it: a pool read before the figure's first probe
        would count the allocation since as context, one read after its last probe what was
        freed since (a context only rises, so that one too large would stay). A context also
        grows as kernels load. Each new largest is said in the daemon's log (the GPU check
        reports it). A trial of several processes on the device (workers that made contexts of
        their own) measures nothing, nor does a device whose probe failed (its processes are
        the last ones NVML listed)."""
        if device is None or group_of is None or not kind_of(device).lists_processes:
            return
        if device.error is not None:
            return
        search_key, workload = device.key, search.fingerprint
        for (device_key, fingerprint, _), pgids in on.groups.items():
            if (device_key, fingerprint) != (search_key, workload):
                continue
            for pgid in pgids:
                held = self._held(device, pgid, group_of)
                last = self._readings.pop(pgid, None)
                if held is None:
                    continue
                # A new figure is steady from this look on: no pool was read since then yet.
                steady = last if last is not None and last.held == held else None
                since = now if steady is None else steady.since
                self._readings[pgid] = Reading(held, since, on.pools.get(pgid))
                # The pool the last look saw was read before this probe.
                pool = None if steady is None else steady.pool
                if pool is None or pool.told <= since or held < pool.pool_mb:
                    continue
                context = held - pool.pool_mb
                if context > MAX_CONTEXT_MB:
                    continue
                if search.context_mb is None or context > search.context_mb:
                    search.context_mb = context
                    log.info(
                        "device %s: a trial of workload %s holds %d MiB, %d of them in its "
                        "framework's pool: its CUDA context is %d MiB",
                        device.key,
                        workload,
                        held,
                        pool.pool_mb,
                        context,
                    )

    @staticmethod
    def _held(device: DeviceSnapshot, pgid: int, group_of: Mapping[int, int]) -> int | None:
        """What the trial of process group `pgid` holds on the device, where NVML lists one
        process of it; None where it lists none, or several (workers with contexts of their
        own: the pool is one process's)."""
        listed = [
            p.used_memory_mb
            for p in device.processes or ()
            if group_of.get(p.pid) == pgid and p.used_memory_mb is not None
        ]
        return listed[0] if len(listed) == 1 else None

    @staticmethod
    def _sweep_over(session: Session, search: SplitSearch) -> bool:
        """Whether the last sweep the search measured for has ended (none: nothing to end)."""
        sweep = None if search.sweep_id is None else session.get(Sweep, search.sweep_id)
        return sweep is not None and sweep.status in (SweepStatus.finished, SweepStatus.cancelled)

    def share(self, model: str, sweep: Sweep) -> Fraction:
        """The share of a device of this model that a trial of the sweep would take there."""
        if sweep.split is not None:
            return Fraction(1, sweep.split)
        search = self._searches.get((model, sweep_fingerprint(sweep)))
        # Not searched on this model yet: its N is unknown, so it may fit in any share left.
        return Fraction(0) if search is None else Fraction(1, search.split)

    def peak_mb(self, *, sweep: Sweep, device_key: str) -> int | None:
        """The most one trial of the sweep's workload held on the device's model in a phase
        its search measured: its points' peaks; None where it was not searched there or no
        point has one. A phase not measured yet does not count: in the first wave the search
        learns from a trial's first reading above a CUDA context, and that phase's peak holds
        only the readings so far (placement would budget a trial by a figure it may outgrow)."""
        model = self._model_of.get(device_key)
        search = self._searches.get((model or "", sweep_fingerprint(sweep)))
        if search is None:
            return None
        seen = [p.memory_per_trial_mb for p in search.curve if p.memory_per_trial_mb is not None]
        return int(max(seen, default=0)) or None

    def out_of_memory(self, *, session: Session, trial: Trial) -> None:
        """A trial of an auto sweep ran out of device memory: lower its workload's N there."""
        model = self._model_of.get(trial.device or "")
        key = (model or "", sweep_fingerprint(trial.sweep))
        if trial.split is not None and key in self._searches:
            self._searches[key].out_of_memory(session=session, split=trial.split)

    def ceiling(self, device: DeviceSnapshot) -> int:
        """The largest N worth trying on the device, budgeting the overhead placement budgets."""
        bound = kind_of(device).ceiling(
            device,
            reserve_mb=self.settings.reserve_mb,
            min_memory_mb=self.settings.min_memory_mb,
            overhead_mb=self.overheads.for_device(device.key),
            cpu_trial_mb=self.settings.cpu_trial_mb,
        )
        return min(MAX_SPLIT, bound)


class Pool(NamedTuple):
    """What a trial's framework said its memory pool holds (MiB), and when it read that."""

    pool_mb: int
    told: datetime


class Reading(NamedTuple):
    """What NVML says a trial's one process holds (MiB), and since when: the first look (after
    its probe) that saw it hold that; and the pool its framework last told at the latest look
    (None: none told)."""

    held: int
    since: datetime
    pool: Pool | None


@dataclass
class ActiveTrials:
    """The active trials on each device, per workload (None: a fixed-split sweep's)."""

    # Each workload's trials there by the N they were launched under.
    splits: defaultdict[tuple[str, str | None], Counter[int]] = field(
        default_factory=lambda: defaultdict(Counter)
    )
    # The share of each device its trials hold: 1/N each.
    shares: defaultdict[str, Fraction] = field(default_factory=lambda: defaultdict(Fraction))
    # A sweep of each workload running there, and the process groups of its trials by the N
    # they were launched under.
    sweep_of: dict[tuple[str, str | None], int] = field(default_factory=dict)
    groups: defaultdict[tuple[str, str | None, int], list[int]] = field(
        default_factory=lambda: defaultdict(list)
    )
    # What each trial's framework last said its memory pool holds, by its process group, and
    # the process groups of the trials that have reported.
    pools: dict[int, Pool] = field(default_factory=dict)
    reported: set[int] = field(default_factory=set)

    @classmethod
    def now(cls, *, session: Session, node_id: int | None = None) -> ActiveTrials:
        """What runs where, as the database says; with `node_id`, on that node's devices
        (trials of no node, from before nodes, count as its own)."""
        on = cls()
        for trial in trial_store.active_trials(session=session):
            if node_id is not None and trial.node_id not in (node_id, None):
                continue
            if trial.device is not None:
                # Fixed-split trials count too: they share the device as much as any.
                fingerprint = sweep_fingerprint(trial.sweep) if trial.sweep.split is None else None
                key = (trial.device, fingerprint)
                # Every launch records its N; one without (none should be) holds the device.
                split = trial.split or 1
                on.splits[key][split] += 1
                on.shares[trial.device] += Fraction(1, split)
                on.sweep_of[key] = trial.sweep_id
                if trial.pid is not None:
                    # The trial's leader started its process group: its pid is the group's id.
                    on.groups[(*key, split)].append(trial.pid)
                    if trial.pool_mb is not None and trial.pool_at is not None:
                        on.pools[trial.pid] = Pool(trial.pool_mb, told=trial.pool_at)
                    if trial.last_report_at is not None:
                        on.reported.add(trial.pid)
        return on


def trial_memory(
    device: DeviceSnapshot | None, pgids: Sequence[int], group_of: Mapping[int, int] | None
) -> list[int]:
    """The memory (MiB) each trial, given by its process group, holds on the device now, for
    those where it can be told."""
    if device is None or group_of is None:
        return []
    kind = kind_of(device)
    held = []
    for pgid in pgids:
        pids = [pid for pid, group in group_of.items() if group == pgid]
        memory = kind.trial_memory_mb(device, pids, resident=resident_mb)
        if memory is not None:
            held.append(memory)
    return held
