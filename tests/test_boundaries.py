"""The import contracts of pyproject.toml hold, and they do catch a forbidden import."""

from __future__ import annotations

import ast
import os
import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from sourcetree import ROOT, copy_of_the_package, scopes

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
        ("gpumux/cli/sneak.py", "from gpumux.storage import trials", "never import the storage"),
        ("gpumux/runtime/sneak.py", "from gpumux import config", "imports nothing else"),
        ("gpumux/storage/sneak.py", "from gpumux.scheduling import loop", "Layers"),
        ("gpumux/search/sneak.py", "from sqlalchemy import select", "only through storage"),
        ("gpumux/processes/rundir.py", "from gpumux import config", "the standard-library"),
        ("gpumux/processes/logfiles.py", "import pathlib", "the standard-library"),
        ("gpumux/runtime/context.py", "from gpumux import throughput", "imports nothing else"),
        ("gpumux/grammar/sweepspec.py", "import subprocess", "do no I/O"),
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
        models.write("\nfrom gpumux.storage import lifecycle  # noqa: E402\n")
    assert ("gpumux.storage.models", "gpumux.storage.lifecycle") in import_cycles(root)


# What a module outside storage/ may take of SQLAlchemy: the transaction it is handed and the
# errors a database raises. import-linter sees SQLAlchemy whole, so this reads the source.
ALLOWED_OUTSIDE_STORAGE = {"sqlalchemy.exc", "sqlalchemy.orm.Session"}
# What a session does that is a query or a row written; `get` (one row by its key) is allowed.
SESSION_QUERIES = {"add", "add_all", "delete", "execute", "merge", "query", "scalar", "scalars"}


def queries_outside_storage(package: Path) -> list[str]:
    """Where a module of `package` outside its storage/ imports more of SQLAlchemy than it
    may, or has a session query or write rows."""
    found = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package.parent)
        if where.parts[1] == "storage":
            continue
        for nodes in scopes(ast.parse(path.read_text(), str(path))):
            found += _queries(where, nodes, _sessions(nodes))
    return found


def _sessions(nodes: list[ast.AST]) -> set[str]:
    """The names that hold a session in one function (or in the rest of a module): `session`,
    a parameter annotated `Session`, and what a `with` over `Sessions.read()`, a write's
    `begin()` or `Session(...)` binds."""
    names = {"session"}
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            every = arguments.posonlyargs + arguments.args + arguments.kwonlyargs
            names |= {a.arg for a in every if "Session" in _named(a.annotation)}
        elif (
            isinstance(node, ast.withitem)
            and isinstance(node.optional_vars, ast.Name)
            and isinstance(node.context_expr, ast.Call)
            and _named(node.context_expr.func) & {"read", "begin", "Session"}
        ):
            names.add(node.optional_vars.id)
    return names


def _named(node: ast.expr | None) -> set[str]:
    """The names an expression mentions, dotted ones by their last part."""
    return {
        sub.id if isinstance(sub, ast.Name) else sub.attr
        for sub in (ast.walk(node) if node is not None else ())
        if isinstance(sub, (ast.Name, ast.Attribute))
    }


def _queries(where: Path, nodes: list[ast.AST], sessions: set[str]) -> list[str]:
    """The imports of SQLAlchemy and the session queries among `nodes` that break the rule."""
    found: list[str] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in SESSION_QUERIES
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in sessions
        ):
            names = [f"session.{node.func.attr}"]
        else:
            continue
        found += [
            f"{where}:{node.lineno}: {name}"
            for name in names
            if (name.startswith("sqlalchemy") or name.startswith("session."))
            and not any(
                name == allowed or name.startswith(f"{allowed}.")
                for allowed in ALLOWED_OUTSIDE_STORAGE
            )
        ]
    return found


def test_every_query_and_row_written_is_in_storage() -> None:
    assert queries_outside_storage(ROOT / "gpumux") == []


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("gpumux/search/space.py", "from sqlalchemy import select"),
        ("gpumux/scheduling/loop.py", "from sqlalchemy.orm import Query"),
        ("gpumux/server/api/sweeps.py", "import sqlalchemy.sql"),
        ("gpumux/splits/searches.py", "def sneak(session):\n    session.add(None)"),
        ("gpumux/scheduling/next_trials.py", "def sneak(session):\n    session.scalars(None)"),
        ("gpumux/scheduling/loop.py", "def sneak(db: Session) -> None:\n    db.execute(None)"),
        (
            "gpumux/scheduling/lines.py",
            "def sneak(sessions: Sessions) -> None:\n"
            "    with sessions.write.begin() as db:\n"
            "        db.add(None)",
        ),
    ],
)
def test_a_query_outside_storage_is_found(tmp_path: Path, module: str, line: str) -> None:
    root = copy_of_the_package(tmp_path)
    with (root / module).open("a") as source:
        source.write(f"\n{line}\n")
    (found,) = queries_outside_storage(root / "gpumux")
    assert found.startswith(f"{module}:")
