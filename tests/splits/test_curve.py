from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumux.splits.curve import (
    Decision,
    candidate_splits,
    cost_parameters,
    effective_ceiling,
    first_split,
    implausible,
    max_measurements,
    next_split,
    workload_fingerprint,
)
from gpumux.throughput import CurvePoint

Curve = Callable[[int], float]
# A runaway search fails the test instead of hanging it.
RUNAWAY = 1000


@dataclass(frozen=True)
class Run:
    decision: Decision
    tried: tuple[int, ...]
    oom_at: int | None
    ceiling: int
    start: int = 1

    @property
    def steps(self) -> int:
        return len(self.tried)

    @property
    def top(self) -> int:
        return effective_ceiling(ceiling=self.ceiling, oom_at=self.oom_at)

    @property
    def bound(self) -> int:
        return max_measurements(ceiling=self.ceiling, start=self.start)


def simulate(
    curve: Curve,
    *,
    ceiling: int,
    oom_from: int | None = None,
    noise: float = 0.0,
    seed: int = 0,
    start: int = 1,
) -> Run:
    """Drive next_split like the scheduler: measure what it asks, with noise, until it settles."""
    rng = random.Random(seed)
    points: list[CurvePoint] = []
    tried: list[int] = []
    oom_at: int | None = None
    while True:
        decision = next_split(points, ceiling=ceiling, oom_at=oom_at, start=start)
        top = effective_ceiling(ceiling=ceiling, oom_at=oom_at)
        assert 1 <= decision.split <= top, decision
        if decision.settled:
            return Run(
                decision=decision, tried=tuple(tried), oom_at=oom_at, ceiling=ceiling, start=start
            )
        assert len(tried) < RUNAWAY, tried
        tried.append(decision.split)
        if oom_from is not None and decision.split >= oom_from:
            # The out-of-memory trial is requeued and its point dropped: only oom_at remains.
            oom_at = decision.split if oom_at is None else min(oom_at, decision.split)
            continue
        factor = rng.uniform(1 - noise, 1 + noise)
        points.append(CurvePoint(split=decision.split, throughput=curve(decision.split) * factor))


def knee(n: int) -> float:
    """Saturates at N=5, then a slope of 0.2% per N."""
    return 100 * min(n, 5) + max(0, n - 5)


def plateau(n: int) -> float:
    return 100.0 if n == 1 else 180.0


def peak_at_8(n: int) -> float:
    return 70.0 * n if n <= 8 else max(10.0, 560.0 - 25.0 * (n - 8))


def linear(n: int) -> float:
    return 100.0 * n


def flat(n: int) -> float:
    return 100.0


@dataclass(frozen=True)
class Shape:
    """A scripted curve, and what the noiseless search tries and settles on."""

    name: str
    curve: Curve
    ceiling: int
    oom_from: int | None
    expected: int
    tried: tuple[int, ...]
    reason: str


def best_true(shape: Shape) -> float:
    """The best throughput among the N that fit: under the ceiling and under the true OOM."""
    top = shape.ceiling if shape.oom_from is None else min(shape.ceiling, shape.oom_from - 1)
    return max(shape.curve(n) for n in range(1, top + 1))


SHAPES = [
    Shape(
        "knee",
        knee,
        34,
        None,
        5,
        (1, 2, 5, 13, 8, 6),
        "knee: N=6 +0.2%, N=8 +0.6% over N=5 (each < 5%); using N=5",
    ),
    Shape("plateau", plateau, 34, None, 2, (1, 2, 3, 5), "knee: N=3 +0.0%, N=5 +0.0%"),
    Shape("peak", peak_at_8, 34, None, 8, (1, 2, 5, 13, 21, 8), "knee: N=13 -22.3%"),
    Shape("memory", linear, 6, None, 6, (1, 2, 5, 6), "the device takes at most N=6; using N=6"),
    Shape("oom", linear, 34, 8, 7, (1, 2, 5, 13, 8, 7), "out of memory at N=8; using N=7"),
    Shape(
        "oom-knee",
        knee,
        34,
        8,
        5,
        (1, 2, 5, 13, 8, 7, 6),
        "out of memory at N=8; using N=5 (best below)",
    ),
    Shape(
        "oom-tight",
        linear,
        34,
        15,
        14,
        (1, 2, 5, 13, 34, 21, 20, 16, 14, 15),
        "out of memory at N=15; using N=14",
    ),
    Shape("flat", flat, 34, None, 1, (1, 2, 3), "knee: N=2 +0.0%, N=3 +0.0%"),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: shape.name)
def test_noiseless_shapes_settle_on_the_knee(shape: Shape) -> None:
    run = simulate(shape.curve, ceiling=shape.ceiling, oom_from=shape.oom_from)

    assert run.decision.split == shape.expected, run.decision.reason
    assert run.tried == shape.tried
    assert run.steps <= run.bound
    assert shape.reason in run.decision.reason
    assert shape.curve(run.decision.split) >= 0.9 * best_true(shape)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: shape.name)
def test_noise_of_ten_percent_rarely_misleads(shape: Shape) -> None:
    seeds = range(200)
    runs = [
        simulate(shape.curve, ceiling=shape.ceiling, oom_from=shape.oom_from, noise=0.1, seed=seed)
        for seed in seeds
    ]

    good = sum(shape.curve(run.decision.split) >= 0.9 * best_true(shape) for run in runs)
    rate = good / len(runs)
    assert rate >= 0.95, f"{shape.name}: {rate:.1%} of runs within 10% of the best"
    assert all(run.steps <= run.bound for run in runs), max(run.steps for run in runs)
    assert all(run.decision.split <= run.top for run in runs)


# Below, near and above the peak of most shapes, and above every ceiling.
STARTS = (2, 8, 21)


@pytest.mark.parametrize("start", STARTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: shape.name)
def test_a_search_from_a_start_measures_it_first_and_settles_near_the_best(
    shape: Shape, start: int
) -> None:
    run = simulate(shape.curve, ceiling=shape.ceiling, oom_from=shape.oom_from, start=start)

    assert run.tried[0] == min(start, shape.ceiling), run.tried
    assert run.steps <= run.bound, run.tried
    assert shape.curve(run.decision.split) >= 0.9 * best_true(shape), run.decision.reason


@pytest.mark.parametrize("start", STARTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: shape.name)
def test_from_any_start_noise_of_ten_percent_rarely_misleads(shape: Shape, start: int) -> None:
    runs = [
        simulate(
            shape.curve,
            ceiling=shape.ceiling,
            oom_from=shape.oom_from,
            noise=0.1,
            seed=seed,
            start=start,
        )
        for seed in range(200)
    ]

    good = sum(shape.curve(run.decision.split) >= 0.9 * best_true(shape) for run in runs)
    rate = good / len(runs)
    assert rate >= 0.95, f"{shape.name} from N={start}: {rate:.1%} within 10% of the best"
    assert all(run.steps <= run.bound for run in runs), max(run.steps for run in runs)
    assert all(run.decision.split <= run.top for run in runs)


def test_a_start_at_the_peak_saves_the_climb_from_one() -> None:
    from_one = simulate(peak_at_8, ceiling=34)
    from_peak = simulate(peak_at_8, ceiling=34, start=8)

    assert from_peak.decision.split == from_one.decision.split == 8
    # Up to the knee, then one N below and the midpoint towards it: N=1..3 are never run.
    assert from_peak.tried == (8, 13, 5, 6)
    assert from_peak.steps < from_one.steps
    assert from_peak.decision.reason.endswith("; below it, N=6 -25.0%")


def test_above_the_peak_the_search_descends_to_the_knee() -> None:
    run = simulate(peak_at_8, ceiling=34, start=21)

    assert run.tried == (21, 34, 13, 8, 5, 6)
    assert run.decision == Decision(
        split=8,
        settled=True,
        reason="fewer trials do at least as well: N=21 -58.0% over N=8, N=6 -25.0%; using N=8",
    )


def test_on_a_plateau_the_descent_prefers_fewer_trials() -> None:
    run = simulate(plateau, ceiling=34, start=8)

    assert run.tried == (8, 13, 5, 3, 2, 1)
    assert run.decision.split == 2
    assert "N=1 -44.4%" in run.decision.reason


def test_a_lower_n_within_the_threshold_takes_the_lead_after_a_knee() -> None:
    curve = [CurvePoint(5, 500.0), CurvePoint(8, 510.0), CurvePoint(13, 505.0)]

    step = next_split(curve, ceiling=34, start=5)
    tie = next_split([*curve, CurvePoint(3, 490.0)], ceiling=34, start=5)
    short = next_split([*curve, CurvePoint(3, 300.0)], ceiling=34, start=5)

    assert step == Decision(split=3, settled=False, reason="measuring N=3 (below N=5)")
    assert tie == Decision(split=2, settled=False, reason="measuring N=2 (below N=3)")
    assert short == Decision(
        split=4, settled=False, reason="measuring N=4 (between N=3 and N=5, measured)"
    )


def test_at_the_ceiling_a_lower_n_must_measure_as_much_to_take_the_lead() -> None:
    # Nothing above the start: the throughput may still rise, so no threshold favours lower N.
    curve = [CurvePoint(6, 600.0), CurvePoint(5, 580.0)]

    decision = next_split(curve, ceiling=6, start=6)

    assert decision.settled and decision.split == 6
    assert decision.reason == "the device takes at most N=6; using N=6; below it, N=5 -3.3%"


def test_a_start_above_the_ceiling_starts_at_the_ceiling() -> None:
    assert next_split([], ceiling=6, start=21) == Decision(
        split=6, settled=False, reason="measuring N=6"
    )
    assert first_split(ceiling=0, start=5) == 1


def test_out_of_memory_at_the_start_backs_off_below_it() -> None:
    run = simulate(linear, ceiling=34, oom_from=8, start=13)

    assert run.tried[:3] == (13, 6, 8), "the start, half of it, then the next step"
    assert run.decision.split == 7 and run.oom_at == 8
    assert "out of memory at N=8" in run.decision.reason
    assert next_split([], ceiling=34, oom_at=13, start=13).split == 6
    # Below a start that fit, an out-of-memory step is followed by the N just below it.
    assert next_split([CurvePoint(8, 800.0)], ceiling=34, oom_at=13, start=8).split == 12


def test_a_start_adds_itself_to_the_candidates_and_the_bound() -> None:
    assert candidate_splits(ceiling=34, start=6) == (1, 2, 3, 5, 6, 8, 13, 21, 34)
    assert candidate_splits(ceiling=34, start=40) == (1, 2, 3, 5, 8, 13, 21, 34)
    # 8 candidates, largest gap 13 -> 4 bisections in each direction, 1 out-of-memory trial.
    assert max_measurements(ceiling=34, start=8) == 17
    assert max_measurements(ceiling=34, start=1) == max_measurements(ceiling=34) == 13


def test_empty_curve_measures_one() -> None:
    assert next_split([], ceiling=8) == Decision(split=1, settled=False, reason="measuring N=1")


def test_one_noisy_dip_does_not_end_the_ascent() -> None:
    curve = [CurvePoint(1, 100.0), CurvePoint(2, 200.0), CurvePoint(3, 190.0), CurvePoint(5, 280.0)]

    decision = next_split(curve, ceiling=34)

    assert decision == Decision(split=8, settled=False, reason="measuring N=8")


def test_the_last_point_of_a_split_wins() -> None:
    curve = [CurvePoint(1, 100.0), CurvePoint(2, 100.0), CurvePoint(2, 300.0)]

    # N=2 at 300 scaled from N=1 (at 100 it would be a miss): the step goes over N=3.
    assert next_split(curve, ceiling=34).split == 5


def test_points_above_the_ceiling_are_ignored() -> None:
    curve = [CurvePoint(1, 100.0), CurvePoint(2, 200.0), CurvePoint(8, 50.0), CurvePoint(13, 40.0)]

    decision = next_split(curve, ceiling=3)

    assert decision == Decision(split=3, settled=False, reason="measuring N=3")


def test_bisection_follows_a_leading_midpoint() -> None:
    curve = [CurvePoint(n, 100.0 * n) for n in (1, 2, 3, 5)] + [
        CurvePoint(8, 510.0),
        CurvePoint(13, 515.0),
    ]

    first = next_split(curve, ceiling=34)
    leading = next_split([*curve, CurvePoint(6, 600.0)], ceiling=34)
    missing = next_split([*curve, CurvePoint(6, 600.0), CurvePoint(7, 610.0)], ceiling=34)

    assert first == Decision(
        split=6, settled=False, reason="measuring N=6 (between N=5 and N=8, measured)"
    )
    assert (leading.split, leading.settled) == (7, False)
    assert (missing.split, missing.settled) == (6, True)


def test_a_midpoint_that_misses_ends_the_search() -> None:
    curve = [CurvePoint(n, 100.0 * n) for n in (1, 2, 3, 5, 8, 13)]
    curve += [CurvePoint(21, 1310.0), CurvePoint(34, 1320.0), CurvePoint(17, 1330.0)]

    decision = next_split(curve, ceiling=34)

    assert (decision.split, decision.settled) == (13, True)


def test_at_the_ceiling_a_single_miss_that_measured_higher_wins() -> None:
    curve = [CurvePoint(n, 100.0 * n) for n in (1, 2, 3, 5)] + [CurvePoint(6, 520.0)]

    decision = next_split(curve, ceiling=6)

    assert decision.settled
    assert decision.split == 6
    assert decision.reason == "the device takes at most N=6; using N=6 (N=6 +4.0% over N=5)"


def test_an_oom_at_a_planned_step_tries_the_n_just_below() -> None:
    curve = [CurvePoint(n, 100.0 * n) for n in (1, 2, 3, 5)]

    decision = next_split(curve, ceiling=34, oom_at=8)

    assert decision == Decision(split=7, settled=False, reason="measuring N=7")


def test_a_second_oom_bisects_towards_it() -> None:
    curve = [CurvePoint(n, 100.0 * n) for n in (1, 2, 3, 5, 8, 13)]

    decision = next_split(curve, ceiling=34, oom_at=20)

    assert decision == Decision(
        split=16,
        settled=False,
        reason="measuring N=16 (between N=13 and N=20, which ran out of memory)",
    )


def test_an_oom_at_one_settles_on_one() -> None:
    decision = next_split([], ceiling=8, oom_at=1)

    assert decision == Decision(split=1, settled=True, reason="out of memory at N=1; using N=1")


def test_a_negative_threshold_is_refused() -> None:
    with pytest.raises(ValueError, match="threshold"):
        next_split([], ceiling=8, threshold=-0.1)


def test_candidates_and_bound() -> None:
    assert candidate_splits(ceiling=34) == (1, 2, 3, 5, 8, 13, 21, 34)
    assert candidate_splits(ceiling=10, oom_at=8) == (1, 2, 3, 5, 7)
    assert candidate_splits(ceiling=34, oom_at=7) == (1, 2, 3, 5)
    assert candidate_splits(ceiling=0) == (1,)
    # 8 candidates, largest gap 13 -> 4 bisections, 1 out-of-memory trial.
    assert max_measurements(ceiling=34) == 13
    assert max_measurements(ceiling=1) == 2


def test_cost_parameters_pick_what_changes_cost() -> None:
    names = ["batch_size", "hidden_units", "n_layers", "lr", "seed", "dropout", "epochs", "BS"]

    assert cost_parameters(names) == ["batch_size", "hidden_units", "n_layers", "BS"]


def test_fingerprint_ignores_learning_rate_and_order() -> None:
    command = ["python", "train.py", "--lr", "{lr}", "--batch", "{batch_size}"]
    base = workload_fingerprint(command, ["batch_size=32,64", "lr=1e-3..1e-1"])

    assert len(base) == 16 and set(base) <= set("0123456789abcdef"), base
    assert workload_fingerprint(command, ["batch_size=32,64", "lr=1e-4..1e-2:log"]) == base
    assert workload_fingerprint(command, ["batch_size=32,64", "seed=1,2,3"]) == base
    assert workload_fingerprint(command, ["lr=1e-3..1e-1", "batch_size=32,64"]) == base
    assert workload_fingerprint(command, ["batch_size=128", "lr=1e-3..1e-1"]) != base
    assert workload_fingerprint([*command, "--deep"], ["batch_size=32,64"]) != base
    assert workload_fingerprint(["python train.py"], []) != workload_fingerprint(
        ["python", "train.py"], []
    )


def test_fingerprint_is_stable_across_several_cost_parameters() -> None:
    command = ["python", "train.py"]

    forward = workload_fingerprint(command, ["width=64", "depth=2,4", "lr=0.1"])
    backward = workload_fingerprint(command, ["lr=0.1", "depth=2,4", "width=64"])

    assert forward == backward
    assert workload_fingerprint(command, ["width=64", "depth=2,8"]) != forward


@st.composite
def curves(draw: st.DrawFn) -> list[float]:
    """Positive throughput for N=1..64: rising to a peak (maybe never), then falling."""
    peak = draw(st.integers(1, 64))
    rises = draw(st.lists(st.floats(1.0, 2.0), min_size=63, max_size=63))
    falls = draw(st.lists(st.floats(0.5, 1.0), min_size=63, max_size=63))
    values = [100.0]
    for n in range(1, 64):
        values.append(values[-1] * (rises[n - 1] if n < peak else falls[n - 1]))
    return values


@settings(max_examples=300, deadline=None)
@given(
    values=curves(),
    ceiling=st.integers(1, 60),
    oom_from=st.none() | st.integers(1, 64),
    noise=st.sampled_from([0.0, 0.1, 0.3]),
    seed=st.integers(0, 2**32),
    start=st.integers(1, 64),
)
def test_any_unimodal_curve_settles_within_the_bound(
    values: list[float], ceiling: int, oom_from: int | None, noise: float, seed: int, start: int
) -> None:
    run = simulate(
        lambda n: values[n - 1],
        ceiling=ceiling,
        oom_from=oom_from,
        noise=noise,
        seed=seed,
        start=start,
    )

    assert run.steps <= run.bound, run.tried
    assert 1 <= run.decision.split <= run.top


@settings(max_examples=300, deadline=None)
@given(
    points=st.lists(
        st.builds(CurvePoint, split=st.integers(-3, 80), throughput=st.floats(0.0, 1e6)),
        max_size=20,
    ),
    ceiling=st.integers(-2, 60),
    oom_at=st.none() | st.integers(-2, 64),
    threshold=st.floats(0.0, 1.0),
    start=st.integers(-2, 64),
)
def test_any_curve_gets_a_split_within_the_ceiling(
    points: list[CurvePoint], ceiling: int, oom_at: int | None, threshold: float, start: int
) -> None:
    decision = next_split(points, ceiling=ceiling, oom_at=oom_at, threshold=threshold, start=start)

    assert 1 <= decision.split <= effective_ceiling(ceiling=ceiling, oom_at=oom_at)
    assert decision.reason


def big_gpu(n: int) -> float:
    """Launch-bound trials on a big GPU: near linear to N=20, then flat and slowly falling."""
    return 1000.0 * min(n, 20) - 5.0 * max(0, n - 20)


def compute_bound(n: int) -> float:
    """One trial nearly fills the device: the best is N=3, then contention costs a little."""
    return {1: 100.0, 2: 190.0}.get(n, 200.0 - 2.0 * (n - 3))


def test_a_big_gpu_from_its_cores_settles_in_three_points() -> None:
    run = simulate(big_gpu, ceiling=100, start=16)

    # One step up gains, the next misses: at N >= 8 one miss is the knee, and the step above
    # measured less than N=21, so nothing between is measured.
    assert run.tried == (16, 21, 34)
    assert run.decision.split == 21
    assert big_gpu(21) >= 0.95 * max(big_gpu(n) for n in range(1, 101))


def test_a_curve_that_scales_is_climbed_in_strides_to_the_ceiling() -> None:
    run = simulate(linear, ceiling=34)

    assert run.tried == (1, 2, 5, 13, 34)
    assert run.decision.split == 34


@pytest.mark.parametrize(
    ("at_3", "step"),
    [(300.0, 8), (271.0, 8), (270.0, 5), (200.0, 5)],
    ids=["linear", "within-threshold", "just-short", "bent"],
)
def test_a_step_goes_over_a_candidate_only_where_each_trial_did_as_well(
    at_3: float, step: int
) -> None:
    curve = [CurvePoint(1, 100.0), CurvePoint(2, 190.0), CurvePoint(3, at_3)]

    # 95 per trial at N=2: N=3 scaled where each of its trials did more than 95% of that
    # (90.25): the step goes over N=5.
    assert next_split(curve, ceiling=34).split == step


def test_no_step_goes_over_a_candidate_after_an_out_of_memory_trial() -> None:
    curve = [CurvePoint(1, 100.0), CurvePoint(2, 200.0), CurvePoint(3, 300.0)]

    assert next_split(curve, ceiling=34).split == 8
    assert next_split(curve, ceiling=34, oom_at=21).split == 5


def test_a_stride_stops_at_three_times_the_last_n() -> None:
    curve = [CurvePoint(13, 1300.0), CurvePoint(21, 2100.0)]

    # Above N=21: 34, then the ceiling; at 64 (3.05x) it is too far to go over 34 for.
    assert next_split(curve, ceiling=63).split == 63
    assert next_split(curve, ceiling=64).split == 34


def test_on_the_cpu_no_step_goes_over_a_candidate_past_the_cores() -> None:
    curve = [CurvePoint(1, 100.0), CurvePoint(2, 200.0)]

    assert next_split(curve, ceiling=34, cores=8).split == 5
    assert next_split(curve, ceiling=34, cores=4).split == 3


def test_a_candidate_stepped_over_is_measured_before_a_bisection() -> None:
    strode = [CurvePoint(1, 100.0), CurvePoint(2, 200.0), CurvePoint(5, 500.0)]

    above = next_split([*strode, CurvePoint(13, 510.0)], ceiling=34)
    below = next_split([*strode, CurvePoint(13, 600.0), CurvePoint(21, 590.0)], ceiling=34)
    scaled = next_split([*strode, CurvePoint(13, 1300.0), CurvePoint(34, 1320.0)], ceiling=34)

    # The knee may lie at the N stepped over above the leader (N=8 between 5 and 13), and the
    # peak at the one below a leader whose step did not scale (N=8 between 5 and 13 again);
    # where the leader's step scaled (13 from 5), the peak is not below it: 21 is the one.
    assert above == Decision(
        split=8, settled=False, reason="measuring N=8 (stepped over between N=5 and N=13)"
    )
    assert below == Decision(
        split=8, settled=False, reason="measuring N=8 (stepped over between N=5 and N=13)"
    )
    assert scaled.split == 21


def test_a_step_filled_in_below_leaders_measured_above_it_does_not_end_the_climb() -> None:
    curve = [CurvePoint(n, t) for n, t in ((1, 100.0), (2, 200.0), (5, 500.0), (13, 700.0))]

    # N=8, gone over and measured once N=21 missed, reads a miss beside N=5 (a knee at
    # N >= 8); N=13 gains over N=5 all the same: it leads, and N=21 above it is refined.
    decision = next_split([*curve, CurvePoint(21, 720.0), CurvePoint(8, 520.0)], ceiling=34)

    assert decision.split == 17, decision.reason


def test_a_first_waves_n_below_a_higher_start_leaves_the_steps_between_to_the_descent() -> None:
    # The first wave ran N=4 (not a step); memory then allowed the start at 13.
    curve = [CurvePoint(4, 400.0), CurvePoint(13, 430.0), CurvePoint(21, 380.0)]

    first = next_split(curve, ceiling=34, start=13)
    second = next_split([*curve, CurvePoint(8, 470.0)], ceiling=34, start=13)
    settled = next_split([*curve, CurvePoint(8, 470.0), CurvePoint(5, 500.0)], ceiling=34, start=13)

    assert (first.split, second.split) == (8, 5), (first.reason, second.reason)
    assert settled.settled and settled.split == 5, settled.reason
    # Where the wave's N does as well as the start, the steps between come first all the same.
    level = [CurvePoint(4, 400.0), CurvePoint(13, 400.0), CurvePoint(21, 380.0)]
    assert next_split(level, ceiling=34, start=13).split == 8


def test_a_compute_bound_workload_from_a_high_guess_descends_to_its_best() -> None:
    run = simulate(compute_bound, ceiling=100, start=16)

    assert run.decision.split == 3, run.decision.reason
    assert run.tried[:2] == (16, 21)


def test_a_plateau_settles_on_its_smallest_n_within_the_threshold_of_the_best() -> None:
    curve = [CurvePoint(13, 1000.0), CurvePoint(21, 990.0), CurvePoint(8, 960.0)]

    # N=5 is within 5% of N=8, which took the lead, but not of the best, N=13: no drift down.
    slope = next_split([*curve, CurvePoint(5, 920.0)], ceiling=34, start=13)
    within = next_split([*curve, CurvePoint(5, 955.0)], ceiling=34, start=13)

    assert slope == Decision(
        split=6, settled=False, reason="measuring N=6 (between N=5 and N=8, measured)"
    )
    assert within == Decision(split=3, settled=False, reason="measuring N=3 (below N=5)")


def test_a_point_more_than_n_times_one_trials_rate_cannot_be() -> None:
    # Measured on a loaded 2-core machine: N=2 at 14x N=1.
    found = implausible([CurvePoint(1, 3941.0)], CurvePoint(2, 54867.0))

    assert found is not None
    why, conflicts = found
    assert conflicts == [1]
    assert "N=2 at 5.487e+04 is 13.9x N=1 at 3941" in why
    assert implausible([CurvePoint(1, 3941.0)], CurvePoint(2, 7000.0)) is None


def test_more_than_the_cores_allow_cannot_be() -> None:
    # Measured on a loaded 2-core machine: N=4 at 2.6x N=2, where both have the two cores.
    curve = [CurvePoint(1, 4535.0), CurvePoint(2, 2678.0)]

    measured = implausible(curve, CurvePoint(4, 6892.0), cores=2)
    on_cores = implausible(curve, CurvePoint(4, 5000.0), cores=2)
    on_a_gpu = implausible(curve, CurvePoint(4, 5000.0))

    assert measured is not None and measured[1] == [2]
    assert on_cores is not None and on_cores[1] == [2]
    assert "N=4 at 5000 is 1.87x N=2 at 2678 with 2x the trials on 2 cores" in on_cores[0]
    assert on_a_gpu is None, "a GPU's trials may each do nearly as much at N=4 as at N=2"
    assert implausible(curve, CurvePoint(4, 3000.0), cores=2) is None
