"""Pruner options: refused when the sweep is sent where the pruner would fail or never prune
later, in the scheduler's tick (which drops a pruner that fails)."""

from __future__ import annotations

import optuna
import pytest

from gpumux.fields import MAX_COUNT
from gpumux.search.methods import (
    PRUNE_FORMS,
    PRUNER_NAMES,
    PruneSpec,
    SearchError,
    make_pruner,
    parse_prune,
    pruners,
)


def checked(text: str) -> PruneSpec:
    """A sweep's --prune, as the API checks it."""
    spec = parse_prune(text)
    assert spec is not None
    make_pruner(spec)
    return spec


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("asha:min_early_stopping_rate=1e308", "asha:min_early_stopping_rate takes a whole number"),
        (
            "asha:min_resource=1e400",
            "asha:min_resource takes a whole number from 0 to 2,147,483,647",
        ),
        ("asha:min_resource=inf", "asha:min_resource takes a whole number"),
        ("asha:reduction_factor=2.5", "asha:reduction_factor takes a whole number"),
        ("asha:min_resource=" + "9" * 5000, "asha:min_resource takes a whole number"),
        ("asha:min_early_stopping_rate=16", "asha would never prune: its first rung"),
        ("asha:reduction_factor=2147483647,min_early_stopping_rate=2", "asha would never prune"),
        ("hyperband:reduction_factor=nan", "hyperband:reduction_factor takes a whole number"),
        ("hyperband:reduction_factor=1", "and reduction_factor of at least 2"),
        ("hyperband:min_resource=0", "hyperband needs min_resource of at least 1"),
        ("hyperband:min_resource=2.5", "hyperband:min_resource takes a whole number from 0"),
        ("hyperband:max_resource=0", "hyperband:max_resource (the last step) must be at least"),
        ("hyperband:min_resource=5,max_resource=4", "must be at least min_resource (5)"),
        ("hyperband:max_resource=2147483648", "hyperband:max_resource takes a whole number"),
        ("median:n_warmup_steps=-1", "median:n_warmup_steps takes a whole number from 0"),
        ("median:n_startup_trials=nan", "median:n_startup_trials takes a whole number"),
        ("median:interval_steps=0", "Pruning interval steps must be at least 1"),
    ],
)
def test_an_option_the_pruner_would_fail_on_is_refused_with_the_fix(text: str, reason: str) -> None:
    with pytest.raises(SearchError) as refused:
        checked(text)
    assert reason in str(refused.value)
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 300


@pytest.mark.parametrize(
    "text",
    [
        "median:n_warmup_steps=1e3",
        "asha:min_resource=auto,reduction_factor=2",
        "asha:reduction_factor=2,min_early_stopping_rate=30",
        "asha:min_resource=2147483647",
        "hyperband:min_resource=1,max_resource=2147483647,reduction_factor=2",
        "hyperband:min_resource=7,max_resource=7",
        "hyperband:max_resource=auto,reduction_factor=2147483647",
    ],
)
def test_what_is_accepted_prunes_at_every_step_a_trial_can_report(text: str) -> None:
    study = optuna.create_study(direction="minimize", pruner=make_pruner(checked(text)))
    steps = [0, 1, 2, 7, 100, 4096, MAX_COUNT]
    for done in range(3):
        trial = study.ask()
        for step in steps:
            trial.report(float(done), step)
        study.tell(trial, float(done))
    running = study.ask()
    for step in steps:
        running.report(10.0, step)
        # What the scheduler's tick asks after each new step: it must answer, not raise.
        running.should_prune()


def test_a_whole_number_written_as_a_float_is_kept_as_an_integer() -> None:
    assert checked("median:n_warmup_steps=1e3").text == "median:n_warmup_steps=1000"


def test_the_pruners_named_without_optuna_are_optunas() -> None:
    optunas: dict[str, type[optuna.pruners.BasePruner]] = {
        "median": optuna.pruners.MedianPruner,
        "asha": optuna.pruners.SuccessiveHalvingPruner,
        "hyperband": optuna.pruners.HyperbandPruner,
    }
    assert tuple(pruners()) == PRUNER_NAMES and pruners() == optunas
    for name in PRUNER_NAMES:
        assert name in PRUNE_FORMS
