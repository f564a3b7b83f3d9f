"""Every --search method runs from `pip install gpumux` alone: what its sampler imports while it
asks comes from gpumux's declared dependencies (extras left out), or the method is refused at
submission saying what to install."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata

import pytest
from packaging.requirements import Requirement

from gpumux.search import methods
from gpumux.status import SearchMethod

# In a fresh interpreter where only `allowed` distributions can be imported (as after
# `pip install gpumux` with no extras), asks the sampler a dozen trials over a float, an integer
# and a choice (CMA-ES: the ranges alone).
ASKS = """
import importlib.abc, json, re, sys
from importlib import metadata

allowed = set(json.loads(sys.argv[2]))
owners = metadata.packages_distributions()


class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        dists = owners.get(name.partition(".")[0], [])
        if dists and not any(re.sub(r"[-_.]+", "-", d).lower() in allowed for d in dists):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
import optuna
from gpumux.search import methods
from gpumux.search.space import distributions_of
from gpumux.status import SearchMethod
from gpumux.grammar.sweepspec import parse_params

method = SearchMethod(sys.argv[1])
tokens = ["lr=1e-4..1e-1", "layers=1..4"] + ([] if method is SearchMethod.cmaes else ["bs=32,64"])
space = distributions_of(parse_params(tokens))
study = optuna.create_study(sampler=methods.make_sampler(method, seed=3, budget=12))
for _ in range(12):
    trial = study.ask(space)
    study.tell(trial, sum(float(v) for v in trial.params.values() if not isinstance(v, str)))
print(len(study.trials), "trials asked")
"""


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", requirement).lower()


def declared_closure(top: str = "gpumux") -> set[str]:
    """`top`'s dependencies without extras, and theirs, as normalised distribution names."""
    seen: set[str] = set()
    todo = [top]
    while todo:
        name = todo.pop()
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            found = _name(requirement.name)
            if found not in seen:
                seen.add(found)
                todo.append(found)
    return seen


def ask_with_only(method: SearchMethod, allowed: set[str]) -> subprocess.CompletedProcess[str]:
    """Twelve asks of the method's sampler where only the `allowed` distributions exist."""
    return subprocess.run(
        [sys.executable, "-c", ASKS, method.value, json.dumps(sorted(allowed | {"gpumux"}))],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "method", [m for m in SearchMethod if m.adaptive and m is not SearchMethod.gp]
)
def test_an_adaptive_search_needs_nothing_gpumux_does_not_install(method: SearchMethod) -> None:
    asked = ask_with_only(method, declared_closure())
    assert asked.returncode == 0, asked.stderr[-2000:]
    assert asked.stdout.split() == ["12", "trials", "asked"]


def test_gp_needs_only_pytorch_beyond_gpumux_and_is_refused_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("torch", reason="GPSampler runs on PyTorch; it is not installed here")
    asked = ask_with_only(SearchMethod.gp, declared_closure() | {"torch"} | _torch_closure())
    assert asked.returncode == 0, asked.stderr[-2000:]
    # None in sys.modules makes `import torch` raise ImportError, as where it is not installed.
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(methods.SearchError, match=r"needs PyTorch .*\(pip install torch\)"):
        methods.check_installed(SearchMethod.gp)


def _torch_closure() -> set[str]:
    """What PyTorch itself brings (sympy, networkx, ...), which `pip install torch` installs."""
    return declared_closure("torch")
