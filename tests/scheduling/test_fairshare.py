"""Fair share: who gets the next free slot when several users queue trials."""

from __future__ import annotations

import heapq
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumux.scheduling.fairshare import DEFAULT_SHARE, Candidate, fair_order

OWNERS = ("alice", "bob", "carol")
SPLITS = (1, 2, 8)


@dataclass(frozen=True)
class Scenario:
    candidates: list[Candidate]
    held: dict[str, Fraction]
    running: dict[str, int]
    shares: dict[str, float]
    max_running: int | None
    limit: int | None

    def order(self) -> list[Candidate]:
        return fair_order(
            self.candidates,
            held=self.held,
            running=self.running,
            shares=self.shares,
            max_running=self.max_running,
            limit=self.limit,
        )


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    specs = draw(
        st.lists(
            st.tuples(
                st.sampled_from(OWNERS),
                st.integers(1, 3),
                st.integers(0, 2),
                st.sampled_from(SPLITS),
            )
        )
    )
    candidates = [
        Candidate(
            trial_id=number, owner=owner, sweep_id=sweep, priority=priority, share=Fraction(1, n)
        )
        for number, (owner, sweep, priority, n) in enumerate(specs, start=1)
    ]
    held = st.builds(Fraction, st.integers(0, 12), st.sampled_from(SPLITS))
    return Scenario(
        candidates=candidates,
        held=draw(st.dictionaries(st.sampled_from(OWNERS), held)),
        running=draw(st.dictionaries(st.sampled_from(OWNERS), st.integers(0, 6))),
        shares=draw(st.dictionaries(st.sampled_from(OWNERS), st.sampled_from([0.5, 1, 2, 3]))),
        max_running=draw(st.none() | st.integers(1, 8)),
        limit=draw(st.none() | st.integers(0, 20)),
    )


def held_after(scenario: Scenario, order: Sequence[Candidate]) -> dict[str, Fraction]:
    """Device shares each owner holds once every trial in the order has started."""
    held = {owner: scenario.held.get(owner, Fraction(0)) for owner in OWNERS}
    for candidate in order:
        held[candidate.owner] += candidate.share
    return held


def running_after(scenario: Scenario, order: Sequence[Candidate]) -> dict[str, int]:
    """Trials each owner runs once every trial in the order has started."""
    chosen = Counter(candidate.owner for candidate in order)
    return {owner: scenario.running.get(owner, 0) + chosen[owner] for owner in OWNERS}


def left_with_room(scenario: Scenario, order: Sequence[Candidate]) -> set[str]:
    """Owners who still have queued trials and are under their limit after the order."""
    running = running_after(scenario, order)
    return {
        candidate.owner
        for candidate in scenario.candidates
        if candidate not in order
        and (scenario.max_running is None or running[candidate.owner] < scenario.max_running)
    }


@settings(deadline=None)
@given(scenarios())
def test_each_candidate_at_most_once_and_within_the_limit(scenario: Scenario) -> None:
    order = scenario.order()
    assert len(set(order)) == len(order)
    assert set(order) <= set(scenario.candidates)
    assert scenario.limit is None or len(order) <= scenario.limit


@settings(deadline=None)
@given(scenarios())
def test_never_exceeds_max_running(scenario: Scenario) -> None:
    order = scenario.order()
    chosen = Counter(candidate.owner for candidate in order)
    for owner, count in chosen.items():
        assert scenario.max_running is None or (
            scenario.running.get(owner, 0) + count <= scenario.max_running
        )


@settings(deadline=None)
@given(scenarios())
def test_stops_early_only_at_the_limit(scenario: Scenario) -> None:
    order = scenario.order()
    if scenario.limit is None or len(order) < scenario.limit:
        assert left_with_room(scenario, order) == set()


@settings(deadline=None)
@given(scenarios())
def test_each_pick_went_to_the_owner_furthest_below_their_share(scenario: Scenario) -> None:
    order = scenario.order()
    held = held_after(scenario, order)
    share = {owner: Fraction(scenario.shares.get(owner, DEFAULT_SHARE)) for owner in OWNERS}
    waiting = left_with_room(scenario, order)
    position = {candidate: index for index, candidate in enumerate(scenario.candidates)}
    for owner in {candidate.owner for candidate in order}:
        for other in waiting - {owner}:
            upcoming = min(
                (c for c in scenario.candidates if c.owner == other and c not in order),
                key=lambda c: (-c.priority, position[c]),
            )
            # Its last pick left this owner at most as far along as the other's next would.
            assert held[owner] / share[owner] <= (held[other] + upcoming.share) / share[other]


@settings(deadline=None)
@given(scenarios())
def test_within_an_owner_priority_first_then_fifo(scenario: Scenario) -> None:
    order = scenario.order()
    position = {candidate: index for index, candidate in enumerate(scenario.candidates)}
    for owner in OWNERS:
        theirs = [candidate for candidate in order if candidate.owner == owner]
        queued = sorted(
            (candidate for candidate in scenario.candidates if candidate.owner == owner),
            key=lambda candidate: (-candidate.priority, position[candidate]),
        )
        assert theirs == queued[: len(theirs)]


def two_users_queue(alice: int, bob: int, draw_order: random.Random) -> list[Candidate]:
    owners = ["alice"] * alice + ["bob"] * bob
    draw_order.shuffle(owners)
    return [
        Candidate(trial_id=number, owner=owner, sweep_id=1 if owner == "alice" else 2)
        for number, owner in enumerate(owners, start=1)
    ]


@settings(deadline=None)
@given(st.integers(1, 40), st.integers(0, 20), st.integers(0, 20), st.randoms())
def test_equal_shares_split_the_slots_evenly(
    slots: int, extra_alice: int, extra_bob: int, draw_order: random.Random
) -> None:
    queue = two_users_queue(slots + extra_alice, slots + extra_bob, draw_order)
    chosen = Counter(c.owner for c in fair_order(queue, held={}, running={}, limit=slots))
    assert chosen["alice"] + chosen["bob"] == slots
    assert abs(chosen["alice"] - chosen["bob"]) <= 1


@settings(deadline=None)
@given(st.integers(1, 40), st.integers(0, 20), st.integers(0, 20), st.randoms())
def test_shares_two_to_one_split_the_slots_in_proportion(
    slots: int, extra_alice: int, extra_bob: int, draw_order: random.Random
) -> None:
    queue = two_users_queue(slots + extra_alice, slots + extra_bob, draw_order)
    order = fair_order(queue, held={}, running={}, shares={"alice": 2, "bob": 1}, limit=slots)
    chosen = Counter(candidate.owner for candidate in order)
    assert chosen["alice"] + chosen["bob"] == slots
    assert abs(chosen["alice"] - 2 * slots / 3) <= 1


@settings(deadline=None)
@given(st.integers(1, 40), st.integers(0, 40), st.sampled_from([0.5, 1, 4]))
def test_a_user_without_competition_gets_every_slot(
    slots: int, others_running: int, share: float
) -> None:
    queue = [Candidate(trial_id=n, owner="alice", sweep_id=1) for n in range(slots + 5)]
    order = fair_order(
        queue,
        held={"bob": Fraction(others_running)},
        running={"bob": others_running},
        shares={"alice": share},
        limit=slots,
    )
    assert order == queue[:slots]


def test_equal_standing_goes_to_the_owner_who_waited_longest() -> None:
    bob1, alice1, alice2, bob2 = (
        Candidate(trial_id=1, owner="bob", sweep_id=2),
        Candidate(trial_id=2, owner="alice", sweep_id=1),
        Candidate(trial_id=3, owner="alice", sweep_id=1),
        Candidate(trial_id=4, owner="bob", sweep_id=2),
    )
    order = fair_order([bob1, alice1, alice2, bob2], held={}, running={})
    assert order == [bob1, alice1, alice2, bob2]


def test_running_trials_count_against_their_owner() -> None:
    queue = [Candidate(trial_id=n, owner="alice", sweep_id=1) for n in range(1, 4)]
    queue += [Candidate(trial_id=n, owner="bob", sweep_id=2) for n in range(4, 7)]
    order = fair_order(queue, held={"alice": Fraction(3)}, running={"alice": 3}, limit=4)
    assert [candidate.owner for candidate in order] == ["bob", "bob", "bob", "alice"]


def test_a_trial_counts_at_its_share_of_a_device_not_as_one() -> None:
    # Bob's trials each hold a whole device, alice's an eighth: she gets eight for his one.
    alice = [
        Candidate(trial_id=n, owner="alice", sweep_id=1, share=Fraction(1, 8)) for n in range(20)
    ]
    bob = [Candidate(trial_id=n, owner="bob", sweep_id=2) for n in (20, 21)]
    order = fair_order([*alice, *bob], held={}, running={})
    assert [c.owner for c in order[:18]] == ["alice"] * 8 + ["bob"] + ["alice"] * 8 + ["bob"]


def test_running_trials_count_at_the_share_they_hold() -> None:
    # Bob runs one trial at N=1, alice one at N=8: alice is 7/8 of a device behind.
    queue = [
        Candidate(trial_id=n, owner="alice", sweep_id=1, share=Fraction(1, 8)) for n in range(17)
    ]
    queue += [Candidate(trial_id=n, owner="bob", sweep_id=2) for n in (17, 18)]
    held = {"bob": Fraction(1), "alice": Fraction(1, 8)}
    order = fair_order(queue, held=held, running={"bob": 1, "alice": 1}, limit=16)
    # Fifteen of hers bring her to 2, as much as his next would bring him to.
    assert [c.owner for c in order] == ["alice"] * 15 + ["bob"]


def test_a_share_outside_a_device_is_refused() -> None:
    with pytest.raises(ValueError, match="trial 1: share"):
        Candidate(trial_id=1, owner="alice", sweep_id=1, share=Fraction(2))


def test_a_higher_priority_sweep_overtakes_its_owners_older_trials() -> None:
    old = [Candidate(trial_id=n, owner="alice", sweep_id=1) for n in (1, 2)]
    urgent = Candidate(trial_id=3, owner="alice", sweep_id=2, priority=5)
    assert fair_order([*old, urgent], held={}, running={}) == [urgent, *old]


def test_an_owner_at_max_running_gets_nothing_more() -> None:
    queue = [Candidate(trial_id=n, owner="alice", sweep_id=1) for n in range(1, 5)]
    held = {"alice": Fraction(1, 8)}
    assert fair_order(queue, held=held, running={"alice": 1}, max_running=3) == queue[:2]
    # The limit counts trials, whatever share of a device they hold.
    assert fair_order(queue, held=held, running={"alice": 3}, max_running=3) == []


def test_a_share_of_zero_is_refused() -> None:
    queue = [Candidate(trial_id=1, owner="alice", sweep_id=1)]
    with pytest.raises(ValueError, match="alice"):
        fair_order(queue, held={}, running={}, shares={"alice": 0})


Order = Callable[[list[Candidate], dict[str, int], int], list[Candidate]]


def fair(queue: list[Candidate], running: dict[str, int], free: int) -> list[Candidate]:
    held = {owner: Fraction(count) for owner, count in running.items()}
    return fair_order(queue, held=held, running=running, limit=free)


def slots_held_while_both_wait(order: Order, seed: int, slots: int = 4) -> dict[str, float]:
    """Time-averaged slots per user while both still have trials queued (event simulation)."""
    rng = random.Random(seed)
    # Alice submits her 20 trials first: strict FIFO would give her every slot.
    queue = [
        Candidate(trial_id=n, owner="alice" if n < 20 else "bob", sweep_id=1 + n // 20)
        for n in range(40)
    ]
    duration = {candidate.trial_id: rng.uniform(1.0, 10.0) for candidate in queue}
    running: list[tuple[float, int, Candidate]] = []
    now = 0.0
    slot_time = {"alice": 0.0, "bob": 0.0}
    while {"alice", "bob"} <= {candidate.owner for candidate in queue}:
        held = Counter(candidate.owner for _, _, candidate in running)
        for candidate in order(queue, dict(held), slots - len(running)):
            queue.remove(candidate)
            heapq.heappush(
                running, (now + duration[candidate.trial_id], candidate.trial_id, candidate)
            )
        held = Counter(candidate.owner for _, _, candidate in running)
        assert len(running) == slots
        ends = running[0][0]
        for owner, count in held.items():
            slot_time[owner] += count * (ends - now)
        now = ends
        while running and running[0][0] == now:
            heapq.heappop(running)
    return {owner: slot_time[owner] / now for owner in ("alice", "bob")}


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_simulation_two_users_hold_two_of_four_slots_each(seed: int) -> None:
    average = slots_held_while_both_wait(fair, seed)
    assert average["alice"] == pytest.approx(2.0, abs=0.05)
    assert average["bob"] == pytest.approx(2.0, abs=0.05)
