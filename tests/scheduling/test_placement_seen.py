"""Placement budgets a first wave's trial, seen holding less, at the slice of the N its sweep's
search has since raised, not at its own cap: the new N's trials fit beside it at once."""

from __future__ import annotations

from datetime import UTC, datetime
from fractions import Fraction
from types import SimpleNamespace
from typing import Any

from builders import H100_MB, h100_snapshot

from gpumux.devices.snapshot import DeviceSnapshot
from gpumux.scheduling.filling import grown_split, running_trials
from gpumux.scheduling.placement import PackingPolicy, PendingTrial, RunningTrial, plan
from gpumux.splits.searches import CONTEXT_MB

POLICY = PackingPolicy()
USABLE = H100_MB - POLICY.reserve_mb
SWEEP = 7
# The first wave: 2 trials at N=2, each capped at half the card; the search has since raised
# the sweep's N to 5, whose slices are a fifth.
WAVE_CAP = USABLE // 2 - POLICY.overhead_mb
NEW_CAP = USABLE // 5 - POLICY.overhead_mb
PIDS = (5001, 5002)


def device(held_mb: int | None, *, unlisted_mb: int = 0) -> DeviceSnapshot:
    """The H100 with the wave's processes listed, each holding `held_mb` (None: NVML lists
    them without their memory), and `unlisted_mb` used that no process accounts for."""
    return h100_snapshot(dict.fromkeys(PIDS, held_mb), unlisted_mb=unlisted_mb)


def wave(seen_mb: int | None, *, grown: int | None = 5) -> list[RunningTrial]:
    return [
        RunningTrial(
            trial_id=100 + slot,
            device_key="GPU-0",
            slot=slot,
            memory_limit_mb=WAVE_CAP,
            split=2,
            grown_split=grown,
            seen_mb=seen_mb,
            # Trials that reported, their workload seen holding no more than they do.
            grows_mb=seen_mb,
        )
        for slot in range(len(PIDS))
    ]


def placed(running: list[RunningTrial], snapshot: DeviceSnapshot) -> list[int]:
    """The caps of what plan() places from a queue of 5 of the sweep at N=5."""
    queue = [
        PendingTrial(trial_id=i, split=None, tuned={"GPU-0": 5}, sweep_id=SWEEP) for i in range(5)
    ]
    result = plan(
        devices=[snapshot],
        running=running,
        pending=queue,
        policy=POLICY,
        our_pids=PIDS,
        # The share the wave holds beyond 1/5, as filling.credits gives it.
        credits={("GPU-0", SWEEP): 2 * (Fraction(1, 2) - Fraction(1, 5))},
    )
    return [p.memory_limit_mb or 0 for p in result.placements]


def test_a_wave_seen_holding_little_lets_the_new_n_in_at_once() -> None:
    assert placed(wave(seen_mb=4000), device(4000)) == [NEW_CAP] * 3


def test_a_wave_not_seen_keeps_its_caps() -> None:
    assert placed(wave(seen_mb=None), device(None)) == []


def test_a_wave_seen_holding_more_than_a_new_slice_keeps_its_caps() -> None:
    # As a TensorFlow trial shows: its whole slice.
    assert placed(wave(seen_mb=NEW_CAP + 1), device(NEW_CAP + 1)) == []
    assert placed(wave(seen_mb=WAVE_CAP), device(WAVE_CAP)) == []


def test_a_wave_whose_n_was_not_raised_keeps_its_caps() -> None:
    assert placed(wave(seen_mb=4000, grown=None), device(4000)) == []


def test_memory_nvml_does_not_report_free_bounds_the_new_trials() -> None:
    # 20 GB used that no process lists: free, less the reserve and what the wave may still
    # grow into within its new slices, holds one more slice, not three.
    unlisted = 20000
    free = H100_MB - 2 * 4000 - unlisted - POLICY.reserve_mb
    growth = 2 * (NEW_CAP + POLICY.overhead_mb - 4000)
    fit = (free - growth) // (NEW_CAP + POLICY.overhead_mb)
    assert 0 < fit < 3
    assert placed(wave(seen_mb=4000), device(4000, unlisted_mb=unlisted)) == [NEW_CAP] * fit


def test_a_fixed_split_sweep_is_never_raised() -> None:
    def trial(split: int | None) -> Any:
        return SimpleNamespace(
            sweep_id=SWEEP, device="GPU-0", split=2, sweep=SimpleNamespace(split=split)
        )

    tuned = {SWEEP: {"GPU-0": 5}}
    assert grown_split(trial(split=None), tuned) == 5
    assert grown_split(trial(split=2), tuned) is None
    assert grown_split(trial(split=None), {SWEEP: {"GPU-0": 2}}) is None


# Through filling.running_trials: what each active trial is seen holding, and what it may grow
# to, as the filler gives them to placement.


# What a trial of SWEEP held at the most in a phase its search measured (a curve point's memory).
MEASURED_MB = 4000


def active(pid: int, *, sweep_id: int, split: int, reported: bool = True) -> Any:
    """An active trial on the H100 under `split`, its cap that N's slice, its leader `pid`."""
    return SimpleNamespace(
        id=pid,
        device="GPU-0",
        slot=pid % 100,
        memory_limit_mb=USABLE // split - POLICY.overhead_mb,
        split=split,
        pid=pid,
        sweep_id=sweep_id,
        last_report_at=datetime(2026, 11, 27, tzinfo=UTC) if reported else None,
    )


def fill(
    trials: list[Any],
    raised: dict[int, int],
    snapshot: DeviceSnapshot,
    *,
    queue: int,
    tuned: int,
    credit: Fraction,
    peak: int | None = MEASURED_MB,
) -> list[int]:
    """The caps of what plan() places from a queue of the sweep SWEEP at N=`tuned`, its
    search's measured peak on the device `peak` (None: no point measured memory)."""
    running = running_trials(
        trials,
        raised=raised,
        devices=[snapshot],
        group_of={t.pid: t.pid for t in trials},
        peaks={("GPU-0", SWEEP): peak},
    )
    pending = [
        PendingTrial(trial_id=i, split=None, tuned={"GPU-0": tuned}, sweep_id=SWEEP)
        for i in range(queue)
    ]
    result = plan(
        devices=[snapshot],
        running=running,
        pending=pending,
        policy=POLICY,
        our_pids=[t.pid for t in trials],
        credits={("GPU-0", SWEEP): credit},
    )
    return [p.memory_limit_mb or 0 for p in result.placements]


def fill_raised_to_5(
    trials: list[Any], seen_mb: dict[int, int], *, peak: int | None = MEASURED_MB
) -> list[int]:
    """fill() where the search of the wave's two trials (5001, 5002, launched at N=2) raised N
    to 5: a queue of 5, the credit that raise left, NVML seeing what `seen_mb` holds."""
    return fill(
        trials,
        {5001: 5, 5002: 5},
        h100_snapshot(seen_mb),
        queue=5,
        tuned=5,
        credit=2 * (Fraction(1, 2) - Fraction(1, 5)),
        peak=peak,
    )


def test_a_neighbour_not_raised_counts_what_it_holds_once() -> None:
    # The wave's 2 trials raised from N=2 to 5, and one trial of N=5 beside them, each seen
    # holding 4,000 MiB: free memory holds that already, so only the rest of each one's
    # budget is growth, and the two slots the shares leave both fit. (Review's probe: the
    # N=5 trial's whole cap counted as growth again, and 1 was placed.)
    trials = [active(5001, sweep_id=SWEEP, split=2), active(5002, sweep_id=SWEEP, split=2)]
    trials.append(active(5003, sweep_id=SWEEP, split=5))
    placed_caps = fill_raised_to_5(trials, {5001: 4000, 5002: 4000, 5003: 4000})
    assert placed_caps == [NEW_CAP] * 2


def test_two_sweeps_on_one_device_each_count_what_they_hold_once() -> None:
    # Sweep SWEEP's 2 trials raised from N=4 to 8; another sweep's 2 at a fixed N=4 hold the
    # other half, each seen holding 4,000 MiB: SWEEP's credit (2 trials of 8) fits.
    trials = [active(5001, sweep_id=SWEEP, split=4), active(5002, sweep_id=SWEEP, split=4)]
    trials += [active(5003, sweep_id=SWEEP + 1, split=4), active(5004, sweep_id=SWEEP + 1, split=4)]
    placed_caps = fill(
        trials,
        {5001: 8, 5002: 8},
        h100_snapshot({5001: 4000, 5002: 4000, 5003: 4000, 5004: 4000}),
        queue=4,
        tuned=8,
        credit=2 * (Fraction(1, 4) - Fraction(1, 8)),
    )
    assert placed_caps == [USABLE // 8 - POLICY.overhead_mb] * 2


def test_a_trial_that_has_not_reported_keeps_its_cap() -> None:
    # Seen holding a CUDA context and nothing yet: it may still grow to its own cap (TensorFlow
    # takes its slice at its first op), so the new N's trials wait for it.
    trials = [
        active(5001, sweep_id=SWEEP, split=2, reported=False),
        active(5002, sweep_id=SWEEP, split=2, reported=False),
    ]
    placed_caps = fill_raised_to_5(trials, {5001: CONTEXT_MB, 5002: CONTEXT_MB})
    assert placed_caps == []


def test_a_reported_trial_is_budgeted_at_its_slice_once_a_measured_phase_bounds_it() -> None:
    trials = [active(5001, sweep_id=SWEEP, split=2), active(5002, sweep_id=SWEEP, split=2)]
    placed_caps = fill_raised_to_5(trials, {5001: 4000, 5002: 4000})
    assert placed_caps == [NEW_CAP] * 3


def test_a_reported_trial_keeps_its_cap_where_no_measured_phase_bounds_it() -> None:
    # The review's worked example: the first wave's 2 trials raised from N=2 to 5, each seen
    # at 4,000 MiB, no point measured (the probe wave, or a restart with no profile). Placed by
    # that reading, 3 new trials of 15,185 MiB: if the wave's grow to 20,000 MiB within their
    # caps, the card needs 88,627 MiB of its 81,559.
    assert 2 * 20000 + 3 * (NEW_CAP + POLICY.overhead_mb) > H100_MB
    trials = [active(5001, sweep_id=SWEEP, split=2), active(5002, sweep_id=SWEEP, split=2)]
    placed_caps = fill_raised_to_5(trials, {5001: 4000, 5002: 4000}, peak=None)
    assert placed_caps == []


def test_a_trial_whose_workload_was_seen_holding_more_keeps_its_cap() -> None:
    # Seen holding 4,000 MiB now, but a trial of its workload held more than a slice of the new
    # N in the search's last phase: it may grow to that.
    trials = [active(5001, sweep_id=SWEEP, split=2), active(5002, sweep_id=SWEEP, split=2)]
    running = running_trials(
        trials,
        raised={5001: 5, 5002: 5},
        devices=[h100_snapshot({5001: 4000, 5002: 4000})],
        group_of={5001: 5001, 5002: 5002},
        peaks={("GPU-0", SWEEP): NEW_CAP + 1},
    )
    assert [t.grows_mb for t in running] == [NEW_CAP + 1] * 2
    assert placed(running, device(4000)) == []
    # A smaller peak: each is budgeted at the new slice, what it holds now its floor.
    running = running_trials(
        trials,
        raised={5001: 5, 5002: 5},
        devices=[h100_snapshot({5001: 4000, 5002: 4000})],
        group_of={5001: 5001, 5002: 5002},
        peaks={("GPU-0", SWEEP): 3000},
    )
    assert [t.grows_mb for t in running] == [4000] * 2
    assert placed(running, device(4000)) == [NEW_CAP] * 3
