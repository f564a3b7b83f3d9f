"""A sweep's tail: what the split search does where the trials left cannot fill its next N."""

from __future__ import annotations

from gpumux.splits.curve import Decision, next_split
from gpumux.splits.tail import climb_short, settle_short
from gpumux.throughput import CurvePoint


def short(curve: list[CurvePoint], *, left: int) -> tuple[int, bool] | None:
    """What the tail decides with `left` trials for the N the search measures next."""
    split = next_split(curve, ceiling=34).split
    decision = settle_short(
        curve,
        split=split,
        left=left,
        threshold=0.05,
        oom_at=None,
        ceiling=34,
        start=1,
        origin="",
    )
    return None if decision is None else (decision.split, decision.settled)


def linear(*splits: int) -> list[CurvePoint]:
    return [CurvePoint(n, 100.0 * n) for n in splits]


def test_the_trials_left_measure_the_step_a_stride_went_over() -> None:
    curve = linear(1, 2, 5, 13)
    assert next_split(curve, ceiling=34).split == 34

    # 25 trials cannot fill N=34, they fill N=21 the stride went over; 12 fill neither.
    assert short(curve, left=25) == (21, False)
    assert short(curve, left=12) == (13, True)
    assert short(curve, left=34) is None


def test_the_trials_left_measure_a_step_gone_over_below_the_largest_n_measured() -> None:
    # N=13 led N=5 without scaling: the peak may lie at N=8, which 12 trials fill (N=21, the
    # climb's next, they do not); 6 trials fill neither: the search goes on, unsettled.
    curve = [CurvePoint(1, 100.0), CurvePoint(2, 200.0), CurvePoint(5, 480.0)]
    curve.append(CurvePoint(13, 700.0))
    assert next_split(curve, ceiling=34).split == 21

    assert short(curve, left=12) == (8, False)
    assert short(curve, left=6) is None


def climbing(curve: list[CurvePoint], *, waiting: int, start: int = 1) -> tuple[int, bool] | None:
    """What a climb decides with `waiting` trials queued, under a ceiling of 31."""
    climb = next_split(curve, ceiling=31, start=start)
    decision = climb_short(curve, climb, waiting=waiting, ceiling=31, oom_at=None, start=start)
    return None if decision is None else (decision.split, decision.settled)


def test_a_climb_the_waiting_trials_cannot_fill_measures_them_all_at_once() -> None:
    # The climb from N=21 goes to the 31 trials memory allows; 27 wait, all the sweep has left
    # once the 21 running end.
    curve = linear(2, 21)
    climb = next_split(curve, ceiling=31)
    assert climb.split == 31 and not climb.settled
    decision = climb_short(curve, climb, waiting=27, ceiling=31, oom_at=None, start=1)
    assert decision is not None and decision.reason == (
        "27 trial(s) of the sweep waiting cannot fill N=31: measuring N=27, all of them at once"
    )
    assert climbing(curve, waiting=27) == (27, False)
    # Enough wait for the climb; no more than an N measured: the tail decides (settle_short).
    assert climbing(curve, waiting=31) is None
    assert climbing(curve, waiting=21) is None
    # A settled decision is no climb.
    settled = Decision(split=31, settled=True, reason="")
    assert climb_short(curve, settled, waiting=27, ceiling=31, oom_at=None, start=1) is None


def test_waiting_trials_below_the_start_after_a_first_wave_are_not_measured_apart() -> None:
    # A first wave of 8 under a start of 16: a point at the 12 waiting would lie below the
    # N the climb starts at, which the search does not go by; the start may still be measured
    # raised, beside the wave's trials.
    wave = linear(8)
    assert next_split(wave, ceiling=31, start=16).split == 16
    assert climbing(wave, waiting=12, start=16) is None
    assert climbing(wave, waiting=15, start=16) is None


def test_a_sweep_with_no_trial_left_says_so() -> None:
    # N=2 measured from a start of 2; the search goes below, to N=1, as the sweep's last
    # trial ends (the README's first sweep on two cores).
    curve = [CurvePoint(2, 200.0)]
    decision = settle_short(
        curve, split=1, left=0, threshold=0.05, oom_at=None, ceiling=4, start=2, origin="a guess"
    )
    assert decision is not None and (decision.split, decision.settled) == (2, True)
    assert decision.reason.startswith("no trial of the sweep is left to measure N=1: using N=2")
