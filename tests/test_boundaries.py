"""The import contracts of pyproject.toml hold, and they do catch a forbidden import."""

from __future__ import annotations

import os
import pkgutil
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(
    not LINT_IMPORTS.exists(), reason="import-linter is not installed (pip install -e '.[dev]')"
)


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports over the gpumux package found under `root`, with its pyproject.toml."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def copy_of_the_package(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "gpumux", tmp_path / "gpumux", ignore=shutil.ignore_patterns("web"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_runtime_contract_forbids_every_other_top_level_module() -> None:
    """A module added at the top of gpumux must be added to what the trial's runtime may not
    import: that contract lists modules one by one."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (runtime,) = (
        c for c in contracts["contracts"] if c.get("source_modules") == ["gpumux.runtime"]
    )
    top_level = {
        f"gpumux.{module.name}" for module in pkgutil.iter_modules([str(ROOT / "gpumux")])
    } - {"gpumux.runtime"}
    assert top_level == set(runtime["forbidden_modules"])


def test_the_package_keeps_its_contracts() -> None:
    checked = lint_imports(ROOT)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "0 broken" in checked.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("gpumux/cli/sneak.py", "from gpumux.storage import store", "never import the storage"),
        ("gpumux/runtime/sneak.py", "from gpumux import config", "imports nothing else"),
        ("gpumux/storage/sneak.py", "from gpumux.scheduling import loop", "Layers"),
        ("gpumux/processes/rundir.py", "from gpumux import config", "the standard-library"),
        ("gpumux/processes/logfiles.py", "import pathlib", "the standard-library"),
        ("gpumux/runtime/context.py", "from gpumux import throughput", "imports nothing else"),
        ("gpumux/sweepspec.py", "import subprocess", "do no I/O"),
        ("gpumux/devices/kinds/gpu.py", "from gpumux.devices import probes", "do no I/O"),
    ],
)
def test_a_forbidden_import_breaks_a_contract(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    root = copy_of_the_package(tmp_path)
    with (root / module).open("a") as source:
        source.write(f"\n{line}  # crosses a boundary\n")
    checked = lint_imports(root)
    assert checked.returncode != 0
    broken = checked.stdout.split("Broken contracts", 1)[1]
    assert contract in broken and module.removesuffix(".py").replace("/", ".") in broken


def import_cycles(root: Path) -> list[tuple[str, str]]:
    """Each pair of modules of the gpumux under `root` that import each other, directly or not
    (what runs: imports for the type checker left out)."""
    code = (
        "import grimp\n"
        "g = grimp.build_graph('gpumux', exclude_type_checking_imports=True)\n"
        "for m in sorted(g.modules):\n"
        "    for i in sorted(g.find_modules_directly_imported_by(m)):\n"
        "        if i != m and g.chain_exists(importer=i, imported=m):\n"
        "            print(m, i)\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [(a, b) for a, b in (line.split() for line in found.stdout.splitlines())]


def test_no_two_modules_import_each_other(tmp_path: Path) -> None:
    assert import_cycles(ROOT) == []
    root = copy_of_the_package(tmp_path)
    with (root / "gpumux/storage/models.py").open("a") as models:
        models.write("\nfrom gpumux.storage import store  # noqa: E402\n")
    assert ("gpumux.storage.models", "gpumux.storage.store") in import_cycles(root)
