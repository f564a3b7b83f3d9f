"""examples/digits_mlp.py runs outside gpumux, imports none of it and prints its report lines."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits_mlp.py"
PREFIX = "GPUMUX_REPORT "
# Runs the example as __main__, then says which modules of gpumux it imported and how many
# threads its BLAS uses.
RUN_AND_LIST = (
    "import runpy, sys\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    "print('IMPORTED', sorted(m for m in sys.modules if m.split('.')[0] == 'gpumux'))\n"
    "from threadpoolctl import threadpool_info\n"
    "print('THREADS', sorted({pool['num_threads'] for pool in threadpool_info()}))\n"
)

# Looked for, not imported: importing it took 1.8 s of CPU of every parallel worker's collection.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("sklearn") is None,
    reason="the example needs scikit-learn (pip install scikit-learn)",
)


def run_example(*flags: str, env: dict[str, str] | None = None) -> list[str]:
    """The example's stdout lines; it must exit 0."""
    result = subprocess.run(
        [sys.executable, "-c", RUN_AND_LIST, str(EXAMPLE), *flags],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_two_epochs_print_two_report_lines_and_the_final_metrics() -> None:
    lines = run_example("--epochs=2", "--lr=0.01", "--width=16")

    reports = [json.loads(line.removeprefix(PREFIX)) for line in lines if line.startswith(PREFIX)]
    assert [(r["step"], r["samples"]) for r in reports] == [(0, 6 * 1437), (1, 6 * 1437)]
    for report in reports:
        assert set(report) == {"step", "samples", "val_loss", "val_accuracy"}
        assert math.isfinite(report["val_loss"]) and 0 <= report["val_accuracy"] <= 1
    # Two epochs at a sane learning rate already beat chance (accuracy 0.1, loss ln 10 = 2.3).
    assert reports[-1]["val_accuracy"] > 0.5 and reports[-1]["val_loss"] < 1.5
    final = lines[-3]
    assert final == (
        f"final val_loss={reports[-1]['val_loss']:.4f} "
        f"val_accuracy={reports[-1]['val_accuracy']:.4f}"
    )
    assert lines[-2] == "IMPORTED []"


def test_its_blas_takes_the_thread_count_gpumux_gives_the_trial() -> None:
    wider = {"OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}

    lines = run_example("--epochs=1", env={**wider, "GPUMUX_CPU_THREADS": "1"})

    assert lines[-1] == "THREADS [1]"
