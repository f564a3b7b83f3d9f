"""The pure parts of benchmarks/peers.py: its flags, its variant order, its verdicts."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def peers() -> ModuleType:
    """benchmarks/peers.py, imported as its script runs it: beside sweep_makespan.py."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))
        return importlib.import_module("peers")


def test_cpu_fractions_are_rounded_down_so_that_cores_over_f_trials_fit(peers: ModuleType) -> None:
    fractions = peers.parse_cpu_fractions("1/2, 2/3,1,0.25", cores=2)
    assert [(cpus.label, cpus.value) for cpus in fractions] == [
        ("1/2", 0.5),
        ("2/3", 0.6666),
        ("1", 1.0),
        ("1/4", 0.25),
    ]
    assert 3 * fractions[1].value <= 2


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0", "is not in (0, 2]"),
        ("-1/2", "is not in (0, 2]"),
        ("3", "is not in (0, 2]"),
        ("half", "is not a number"),
        ("1/0", "is not a number"),
        ("1,,2", "is not a number"),
    ],
)
def test_a_wrong_cpu_fraction_is_named(peers: ModuleType, text: str, says: str) -> None:
    with pytest.raises(ValueError, match=r"^--ray-cpus: .*" + says.replace("(", r"\(")):
        peers.parse_cpu_fractions(text, cores=2)


def test_splits_are_whole_numbers_of_one_or_more(peers: ModuleType) -> None:
    assert peers.parse_splits("2,3, 4") == [2, 3, 4]
    for wrong in ("0", "2.5", "two", "2,"):
        with pytest.raises(ValueError, match="^--splits: .* is not a whole number"):
            peers.parse_splits(wrong)


def test_each_repeat_starts_one_variant_later(peers: ModuleType) -> None:
    variants = [peers.Variant(name, "gpumux") for name in "abc"]
    orders = [[v.name for v in peers.rotated(variants, repeat)] for repeat in range(4)]
    assert orders == [list("abc"), list("bca"), list("cab"), list("abc")]


def test_the_accuracy_is_the_last_final_line(peers: ModuleType) -> None:
    output = (
        "Epoch 1/5\nfinal val_loss=0.5 val_accuracy=0.8\nfinal val_loss=0.1 val_accuracy=0.9721\n"
    )
    assert peers.final_accuracy(output) == 0.9721
    with pytest.raises(ValueError, match="printed no 'final"):
        peers.final_accuracy("Epoch 1/5\nKilled\n")


def test_verdicts_compare_auto_with_the_best_fixed_n_and_the_best_ray_setting(
    peers: ModuleType,
) -> None:
    # The medians issue 13 quotes for this machine.
    median = {
        "sequential": 72.9,
        "Ray Tune cpu=1/2": 52.0,
        "Ray Tune cpu=2/3": 49.5,
        "N=2": 50.1,
        "N=3": 46.7,
        "auto": 48.2,
        "auto (reused)": 42.6,
    }
    lines = peers.verdicts(median, ["N=2", "N=3"], ["Ray Tune cpu=1/2", "Ray Tune cpu=2/3"])
    assert lines == [
        "auto: 1.03 x the best fixed N (N=3, 46.7 s); 0.97 x Ray Tune cpu=2/3 (49.5 s), "
        "3% faster; speed-up over sequential 1.51x",
        "auto (reused): 0.91 x the best fixed N (N=3, 46.7 s); 0.86 x Ray Tune cpu=2/3 "
        "(49.5 s), 14% faster; speed-up over sequential 1.71x",
    ]


def test_verdicts_without_ray_leave_it_out_and_slower_reads_slower(peers: ModuleType) -> None:
    median = {"sequential": 60.0, "N=2": 40.0, "auto": 44.0, "auto (reused)": 40.0}
    assert peers.verdicts(median, ["N=2"], []) == [
        "auto: 1.10 x the best fixed N (N=2, 40.0 s); speed-up over sequential 1.36x",
        "auto (reused): 1.00 x the best fixed N (N=2, 40.0 s); speed-up over sequential 1.50x",
    ]
    assert peers.faster(1.1) == "10% slower"
    assert peers.faster(0.86) == "14% faster"


def test_without_ray_its_variants_are_left_out_saying_why(
    peers: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    reason = peers.ray_missing()
    assert reason is not None
    assert "ray" in reason
    assert reason.endswith("install it with pip install -e '.[peers]'")
    args = argparse.Namespace(ray_cpus="1/2,1", splits="2,3")
    assert [v.name for v in peers.variants_of(args, reason)] == [
        "sequential",
        "N=2",
        "N=3",
        "auto",
    ]
    assert [v.name for v in peers.variants_of(args, None)] == [
        "sequential",
        "Ray Tune cpu=1/2",
        "Ray Tune cpu=1",
        "N=2",
        "N=3",
        "auto",
    ]
