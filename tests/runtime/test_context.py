"""The trial contract as the trial reads it."""

from __future__ import annotations

import pytest

from gpumux.runtime import context


def test_context_reads_the_launcher_contract() -> None:
    trial = context.current(
        {
            "GPUMUX_TRIAL_ID": "12",
            "GPUMUX_ATTEMPT": "3",
            "GPUMUX_URL": "unix:/run/gpumux.sock",
            "GPUMUX_TRIAL_TOKEN": "t",
            "GPUMUX_DEVICE_KIND": "mps",
            "GPUMUX_FRAMEWORK_DEVICE": "cuda",
            "GPUMUX_MEMORY_LIMIT_MB": "4096",
            "GPUMUX_DEVICE_MEMORY_MB": "143771",
            "GPUMUX_SPLIT": "4",
        }
    )

    assert trial is not None
    assert (trial.trial_id, trial.attempt, trial.url, trial.token) == (
        12,
        3,
        "unix:/run/gpumux.sock",
        "t",
    )
    assert (trial.memory_limit_mb, trial.device_memory_mb, trial.split) == (4096, 143771, 4)
    assert trial.cpu_threads is None
    # The kind's name is not what caps the frameworks: what it says they train on is.
    assert trial.on_gpu
    assert context.current({}) is None


def test_a_trial_whose_kind_says_its_frameworks_train_on_the_cpu_is_not_on_a_gpu() -> None:
    trial = context.current({"GPUMUX_TRIAL_ID": "1", "GPUMUX_FRAMEWORK_DEVICE": "cpu"})
    assert trial is not None and not trial.on_gpu
    # A contract from before the variable: its kind says which of the two it was.
    before = context.current({"GPUMUX_TRIAL_ID": "1", "GPUMUX_DEVICE_KIND": "gpu"})
    assert before is not None and before.on_gpu
    before_cpu = context.current({"GPUMUX_TRIAL_ID": "1", "GPUMUX_DEVICE_KIND": "cpu"})
    assert before_cpu is not None and not before_cpu.on_gpu


def test_malformed_numbers_are_ignored_with_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    trial = context.current({"GPUMUX_TRIAL_ID": "5", "GPUMUX_SPLIT": "four"})

    assert trial is not None
    assert trial.split is None
    assert trial.attempt == 1
    assert (
        capsys.readouterr().err == "gpumux: WARNING: ignoring GPUMUX_SPLIT='four': not an integer\n"
    )
