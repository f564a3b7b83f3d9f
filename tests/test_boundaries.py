"""The import contracts of pyproject.toml hold, and they do catch a forbidden import."""

from __future__ import annotations

import ast
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
        ("gpumux/cli/sneak.py", "from gpumux.storage import trials", "never import the storage"),
        ("gpumux/runtime/sneak.py", "from gpumux import config", "imports nothing else"),
        ("gpumux/storage/sneak.py", "from gpumux.scheduling import loop", "Layers"),
        ("gpumux/search/sneak.py", "from sqlalchemy import select", "only through storage"),
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
        for nodes in _scopes(ast.parse(path.read_text(), str(path))):
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


# A row loaded through storage changes there too: outside storage/, no field of a row is
# assigned or deleted. What holds a row is followed by name within each function: a parameter
# or variable annotated with a model (or an alias of one), what a function returning rows gave,
# `session.get`, a loop over rows, an alias. Functions and models are resolved through the
# module's imports, so a client's `get_trial` is not storage's. A row kept in another object's
# field (`NextTrial.trial`, `self.trial`) is not followed; no module outside storage writes one.
class _Module:
    """One module's name and what its imported and own names stand for, qualified."""

    def __init__(self, package: Path, path: Path, tree: ast.Module) -> None:
        self.tree = tree
        self.name = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        self.imports: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname is not None:
                        self.imports[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def qualified(self, node: ast.expr) -> str | None:
        """What a name (`get_trial`, `trial_store.get_trial`, `self.ask`) stands for."""
        if isinstance(node, ast.Name):
            return self.imports.get(node.id, f"{self.name}.{node.id}")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in ("self", "cls"):
                return f"{self.name}.{node.attr}"
            if node.value.id in self.imports:
                return f"{self.imports[node.value.id]}.{node.attr}"
        return None

    def mentions(self, where: ast.expr | None, types: set[str], *, quoted: bool = True) -> bool:
        """Whether an annotation (quoted or not; `quoted` False: an expression whose strings
        are only text) names one of `types`."""
        for node in ast.walk(where) if where is not None else ():
            if isinstance(node, (ast.Name, ast.Attribute)) and self.qualified(node) in types:
                return True
            if quoted and isinstance(node, ast.Constant) and isinstance(node.value, str):
                try:
                    if self.mentions(ast.parse(node.value, mode="eval").body, types):
                        return True
                except SyntaxError:
                    continue
        return False


def _definitions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """A module's functions and its classes' methods (not the functions nested in them)."""
    found: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(node)
        elif isinstance(node, ast.ClassDef):
            todo += node.body
    return found


def row_types(modules: list[_Module]) -> set[str]:
    """The qualified names that stand for a row: the classes of storage/models.py (each derives
    from its `Base` or from one of them) and the aliases that wrap one (`AskingNodeDep`)."""
    (models,) = (module for module in modules if module.name == "gpumux.storage.models")
    types = {"gpumux.storage.models.Base"}
    for node in models.tree.body:
        if isinstance(node, ast.ClassDef) and any(
            models.mentions(base, types, quoted=False) for base in node.bases
        ):
            types.add(f"{models.name}.{node.name}")
    for module in modules:
        for node in module.tree.body:
            if isinstance(node, ast.Assign) and module.mentions(node.value, types, quoted=False):
                types |= {f"{module.name}.{t.id}" for t in node.targets if isinstance(t, ast.Name)}
    return types - {"gpumux.storage.models.Base"}


def row_functions(modules: list[_Module], types: set[str]) -> set[str]:
    """The functions and methods whose results hold rows, qualified (a method by its module)."""
    return {
        f"{module.name}.{node.name}"
        for module in modules
        for node in _definitions(module.tree)
        if module.mentions(node.returns, types)
    }


class _Rows:
    """The names that hold rows in one function (nested ones included) or in the rest of a
    module (its own statements and its classes')."""

    def __init__(
        self, module: _Module, nodes: list[ast.AST], types: set[str], functions: set[str]
    ) -> None:
        self.module, self.types, self.functions = module, types, functions
        self.names: set[str] = set()
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = node.args
                every = arguments.posonlyargs + arguments.args + arguments.kwonlyargs
                every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
                self.names |= {a.arg for a in every if module.mentions(a.annotation, types)}
            elif isinstance(node, ast.AnnAssign) and module.mentions(node.annotation, types):
                self.names |= _bound(node.target)
        bindings = [(target, value) for node in nodes for target, value in _bindings(node)]
        # To a fixed point: what is bound to a name found later in the text holds rows too.
        known = -1
        while known < len(self.names):
            known = len(self.names)
            for target, value in bindings:
                if self.holds(value):
                    self.names |= _bound(target)

    def holds(self, value: ast.expr) -> bool:
        """Whether an expression's value is a row, or rows (a list, a tuple, a page of them)."""
        match value:
            case ast.Name(id=name):
                return name in self.names
            case ast.Attribute(value=inner) | ast.Subscript(value=inner) | ast.Await(value=inner):
                return self.holds(inner)
            case ast.Starred(value=inner) | ast.NamedExpr(value=inner):
                return self.holds(inner)
            case ast.IfExp(body=body, orelse=orelse):
                return self.holds(body) or self.holds(orelse)
            case ast.BoolOp(values=values) | ast.Tuple(elts=values) | ast.List(elts=values):
                return any(self.holds(v) for v in values)
            case ast.ListComp(elt=elt) | ast.GeneratorExp(elt=elt) | ast.SetComp(elt=elt):
                return self.holds(elt)
            case ast.Call(func=ast.Attribute(value=ast.Name(id="session"), attr="get")):
                return True
            case ast.Call(func=ast.Attribute(value=inner, attr="items" | "values")):
                return self.holds(inner)
            case ast.Call(func=function):
                called = self.module.qualified(function)
                return called in self.functions or called in self.types
        return False

    def changed(self, target: ast.expr) -> bool:
        """Whether assigning (or deleting) `target` changes a row: a field of one, or an item
        of a field (a JSON column)."""
        if not isinstance(target, (ast.Attribute, ast.Subscript)):
            return False
        root = target.value
        while isinstance(root, (ast.Attribute, ast.Subscript)) and not self.holds(root):
            root = root.value
        return self.holds(root)


def _bound(target: ast.expr) -> set[str]:
    """The names an assignment's or a loop's target binds."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Starred):
        return _bound(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return {name for element in target.elts for name in _bound(element)}
    return set()


def _bindings(node: ast.AST) -> list[tuple[ast.expr, ast.expr]]:
    """What `node` binds to what: (target, value), a loop's target to what it iterates."""
    if isinstance(node, ast.Assign):
        return [(target, node.value) for target in node.targets]
    if isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
        return [(node.target, node.value)]
    if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        return [(node.target, node.iter)]
    if isinstance(node, ast.withitem) and node.optional_vars is not None:
        return [(node.optional_vars, node.context_expr)]
    return []


def _scopes(tree: ast.Module) -> list[list[ast.AST]]:
    """The nodes of each of a module's functions and methods (with the functions nested in
    them), and those of the rest of the module (its own statements and its classes')."""
    functions = _definitions(tree)
    apart = {id(function) for function in functions}
    rest: list[ast.AST] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        rest.append(node)
        todo += [child for child in ast.iter_child_nodes(node) if id(child) not in apart]
    return [*(list(ast.walk(function)) for function in functions), rest]


def rows_changed_outside_storage(package: Path) -> list[str]:
    """Where a module of `package` outside its storage/ changes a row itself: assigns or
    deletes a field of one (or an item of a field), or calls setattr or delattr on one."""
    paths = sorted(package.rglob("*.py"))
    modules = [_Module(package, path, ast.parse(path.read_text(), str(path))) for path in paths]
    types = row_types(modules)
    functions = row_functions(modules, types)
    found = []
    for path, module in zip(paths, modules, strict=True):
        where = path.relative_to(package.parent)
        if where.parts[1] == "storage":
            continue
        for nodes in _scopes(module.tree):
            rows = _Rows(module, nodes, types, functions)
            for node in nodes:
                if isinstance(node, (ast.Assign, ast.Delete)):
                    targets = node.targets
                elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                    targets = [node.target]
                elif (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id in ("setattr", "delattr")
                    and node.args
                    and rows.holds(node.args[0])
                ):
                    found.append(f"{where}:{node.lineno}: {node.func.id}")
                    continue
                else:
                    continue
                found += [
                    f"{where}:{node.lineno}: {ast.unparse(element)}"
                    for target in targets
                    for element in _elements(target)
                    if rows.changed(element)
                ]
    return found


def _elements(target: ast.expr) -> list[ast.expr]:
    """The targets one assignment's target holds (`a.x, b.y = ...` holds two)."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [leaf for element in target.elts for leaf in _elements(element)]
    if isinstance(target, ast.Starred):
        return _elements(target.value)
    return [target]


def test_no_row_is_changed_outside_storage() -> None:
    assert rows_changed_outside_storage(ROOT / "gpumux") == []


# The writes the scheduler once did itself, each where it was, and the other ways to one.
ROW_WRITES = [
    (
        "gpumux/scheduling/lines.py",
        "def sneak(session: Session, trial_id: int, scanned: int) -> None:\n"
        "    trial = trial_store.get_trial(session=session, trial_id=trial_id)\n"
        "    if trial is not None:\n"
        "        trial.log_scanned = scanned",
    ),
    (
        "gpumux/scheduling/loop.py",
        "def sneak(session: Session, trial_id: int) -> None:\n"
        "    if (trial := trial_store.get_trial(session=session, trial_id=trial_id)):\n"
        "        trial.pid, trial.pid_started = 1, 2",
    ),
    ("gpumux/scheduling/loop.py", "def sneak(trial: Trial | None) -> None:\n    trial.error = ''"),
    (
        "gpumux/scheduling/reconcile.py",
        "def sneak(session: Session) -> None:\n"
        "    for trial in trial_store.active_trials(session=session):\n"
        "        trial.node_id = None",
    ),
    (
        "gpumux/scheduling/filling.py",
        "def sneak(session: Session) -> None:\n"
        "    pages = [sweep_store.open_sweeps(session=session)]\n"
        "    for page in pages:\n"
        "        for sweep in page:\n"
        "            sweep.priority += 1",
    ),
    (
        "gpumux/splits/searches.py",
        "def sneak(session: Session) -> None:\n    session.get(Sweep, 1).split = 2",
    ),
    (
        "gpumux/server/api/nodes.py",
        "def sneak(node: AskingNodeDep) -> None:\n    setattr(node, 'name', 'other')",
    ),
    (
        "gpumux/search/studies.py",
        "def sneak(trial: Trial) -> None:\n    del trial.sweep.params['x']",
    ),
]


def test_each_row_changed_outside_storage_is_found(tmp_path: Path) -> None:
    root = copy_of_the_package(tmp_path)
    added = []
    for module, code in ROW_WRITES:
        path = root / module
        first = len(path.read_text().splitlines()) + 2
        with path.open("a") as source:
            source.write(f"\n{code}\n")
        added.append((module, range(first, first + code.count("\n") + 1)))
    found = [where.split(":")[:2] for where in rows_changed_outside_storage(root / "gpumux")]
    for module, lines in added:
        assert any(m == module and int(n) in lines for m, n in found), (module, found)
    assert all(any(m == module and int(n) in lines for module, lines in added) for m, n in found)
