"""Optuna, and numpy through it, are imported only by the sweeps that use them: a sampler or a
pruner named. The daemon's start, `gpumux --help` and a grid or random sweep import neither
(they cost every daemon about 0.3 s of CPU at start: docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ports import free_port

FIXTURES = Path(__file__).parents[1] / "fixtures"
# In a fresh interpreter: which of optuna and numpy each step has loaded, as JSON on stdout;
# the last step plans the sweep whose fields are the first argument.
STEPS = """
import contextlib, io, json, os, sys

from gpumux.main import main

loaded = {}


def look(step):
    loaded[step] = sorted(name for name in ("optuna", "numpy") if name in sys.modules)


with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main(["--help"])
look("gpumux --help")
# What `gpumux serve` runs, and `gpumux sweep` with no daemon (it embeds one).
from gpumux.server import daemon
from gpumux.server.api import create_app
from gpumux.cli import sweep
look("the daemon's and the sweep command's modules")

from gpumux.schemas.sweeps import SweepCreate
from gpumux.search import methods, planning


def plan(**fields):
    sweep_in = SweepCreate(command=["true"], workdir=os.getcwd(), **fields)
    planning.check_sweep(sweep_in)  # the command line's check
    # The route's.
    methods.check_installed(planning.plan_sweep(sweep_in, max_grid=100, seed=1).search)


plan(params=["x=1..3", "tag=a,b"])
plan(params=["lr=1e-4..1e-1"], trials=4, prune="none")  # random: a budget, no method
plan(params=["x=1,2"], search="random", trials=2, metric="loss", mode="min")
look("grid and random sweeps planned")
plan(params=["x=1..3"], metric="loss", mode="min", **json.loads(sys.argv[1]))
look("a sweep naming a sampler or a pruner planned")
import optuna

# Whatever way in came first, Optuna's INFO lines are off.
loaded["optuna's log level"] = optuna.logging.get_verbosity() == optuna.logging.WARNING
print(json.dumps(loaded))
"""


@pytest.mark.parametrize(
    "named", [{"search": "tpe", "trials": 4}, {"prune": "median"}], ids=["tpe", "median"]
)
def test_only_a_sweep_naming_a_sampler_or_pruner_imports_optuna_and_numpy(
    tmp_path: Path, named: dict[str, object]
) -> None:
    result = subprocess.run(
        [sys.executable, "-c", STEPS, json.dumps(named)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(result.stdout) == {
        "gpumux --help": [],
        "the daemon's and the sweep command's modules": [],
        "grid and random sweeps planned": [],
        # The probe sees them where they are imported.
        "a sweep naming a sampler or a pruner planned": ["numpy", "optuna"],
        "optuna's log level": True,
    }


# `gpumux sweep` run to its end on the daemon it embeds, then what the process had loaded.
SWEEP = """
import json, sys

from gpumux.main import main

try:
    main(sys.argv[1:])
finally:
    loaded = sorted(name for name in ("optuna", "numpy") if name in sys.modules)
    print("loaded:", json.dumps(loaded))
"""


def test_a_grid_sweep_on_an_embedded_daemon_imports_neither(tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith("GPUMUX_")}
    env.update(GPUMUX_HOME=str(tmp_path / "home"), GPUMUX_URL=f"http://127.0.0.1:{free_port()}")
    echo = str(FIXTURES / "echo_params.py")
    result = subprocess.run(
        [sys.executable, "-c", SWEEP, "sweep", "x=1,2", "--", sys.executable, echo],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "2 succeeded" in result.stdout and "running an embedded one" in result.stderr
    assert result.stdout.splitlines()[-1] == "loaded: []"
