"""The order filling offers the queue to placement in: fair by device share, and a trial that
reserved keeps its turn."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import pytest
from builders import cpu_snapshot

from gpumux.scheduling.fairshare import Candidate, fair_order
from gpumux.scheduling.filling import heads_first
from gpumux.scheduling.placement import (
    PackingPolicy,
    PendingTrial,
    RunningTrial,
    expected_split,
    plan,
)


def test_a_trial_that_reserved_the_device_goes_first_at_the_next_fill() -> None:
    # Sweep 1 (N=2) holds half the CPU; sweep 2's trial (N=1) is first in line and reserves it.
    running = [RunningTrial(trial_id=1, device_key="cpu", slot=0, memory_limit_mb=None, split=2)]
    sweep_of = {11: 1, 12: 1, 21: 2, 22: 2}
    fair = [PendingTrial(21, 1), PendingTrial(11, 2), PendingTrial(22, 1), PendingTrial(12, 2)]
    first = plan(devices=[cpu_snapshot()], running=running, pending=fair, policy=PackingPolicy())
    assert first.placements == [] and first.reserved == {"cpu": 21}
    heads = [sweep_of[trial_id] for trial_id in first.reserved.values()]
    # The half freed; fair share now puts sweep 1 first, which would take it again.
    refair = [PendingTrial(11, 2), PendingTrial(12, 2), PendingTrial(21, 1), PendingTrial(22, 1)]
    ordered = heads_first(refair, heads, sweep_of)
    assert [t.trial_id for t in ordered] == [21, 11, 12, 22]
    (placed,) = plan(
        devices=[cpu_snapshot()], running=[], pending=ordered, policy=PackingPolicy()
    ).placements
    assert (placed.trial_id, placed.split) == (21, 1)
    assert heads_first(refair, [], sweep_of) == refair


def device_time_while_both_wait(bob_first: bool) -> dict[str, float]:
    """Each user's average share of one CPU while both queue, trials of equal length, filled
    tick by tick as the filler does: fair order by expected share, heads first, then plan."""
    split = {"alice": 8, "bob": 1}
    owners = ["bob", "alice"] if bob_first else ["alice", "bob"]
    queue = [(n, owner) for n, owner in enumerate(o for o in owners for _ in range(100))]
    owner_of = dict(queue)
    sweep_of = {trial_id: split[owner] for trial_id, owner in queue}
    devices, policy = [cpu_snapshot()], PackingPolicy()
    running: list[tuple[int, RunningTrial]] = []  # (the tick it ends at, the trial)
    heads: list[int] = []
    held_time = {"alice": Fraction(0), "bob": Fraction(0)}
    tick = 0
    while {"alice", "bob"} <= {owner for _, owner in queue}:
        held = {"alice": Fraction(0), "bob": Fraction(0)}
        for _, trial in running:
            held[owner_of[trial.trial_id]] += Fraction(1, trial.split)
        count = Counter(owner_of[trial.trial_id] for _, trial in running)
        pending = {n: PendingTrial(n, split[owner]) for n, owner in queue}
        candidates = [
            Candidate(
                n,
                owner,
                sweep_of[n],
                share=Fraction(1, expected_split(pending[n], devices, policy)),
            )
            for n, owner in queue
        ]
        order = fair_order(candidates, held=held, running=count)
        ordered = heads_first([pending[c.trial_id] for c in order], heads, sweep_of)
        made = plan(
            devices=devices, running=[t for _, t in running], pending=ordered, policy=policy
        )
        heads = [sweep_of[trial_id] for trial_id in made.reserved.values()]
        for placed in made.placements:
            queue.remove((placed.trial_id, owner_of[placed.trial_id]))
            trial = RunningTrial(placed.trial_id, "cpu", placed.slot, None, placed.split)
            running.append((tick + 1, trial))
        for _, trial in running:
            held_time[owner_of[trial.trial_id]] += Fraction(1, trial.split)
        tick += 1
        running = [(end, trial) for end, trial in running if end > tick]
    return {owner: float(time / tick) for owner, time in held_time.items()}


@pytest.mark.parametrize("bob_first", [False, True])
def test_users_at_different_splits_get_even_device_time(bob_first: bool) -> None:
    # Bob's trials hold the whole CPU (N=1), alice's an eighth (N=8): counted by trials, bob
    # would get eight times alice's device time.
    average = device_time_while_both_wait(bob_first)
    assert 0.8 <= average["alice"] / average["bob"] <= 1.25
    assert average["alice"] + average["bob"] >= 0.9
