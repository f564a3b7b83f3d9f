"""No module outside storage/ changes a row itself: a field of a row loaded through storage is
changed by a function of storage, named for what the change means."""

from __future__ import annotations

import ast
from collections.abc import Set
from pathlib import Path

from sourcetree import ROOT, copy_of_the_package, definitions, scopes


# A row loaded through storage changes there too: outside storage/, no field of a row is
# assigned or deleted. What holds a row is followed by name within each function: a parameter
# or variable annotated with a model (or an alias of one), what a function returning rows gave,
# `session.get`, a loop over rows, an alias. Functions and models are resolved through the
# module's imports, so a client's `get_trial` is not storage's. A field of a class's own object
# that holds a row (`self.trial`: assigned a row in one of its methods, or annotated with a model
# there or in the class's body, as a dataclass's field) is followed in all of its methods; one
# read through another object (`next.trial` of a `NextTrial`) is not.
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
        for node in definitions(module.tree)
        if module.mentions(node.returns, types)
    }


class _Rows:
    """The names that hold rows in one function (nested ones included) or in the rest of a
    module (its own statements and its classes')."""

    def __init__(
        self,
        module: _Module,
        nodes: list[ast.AST],
        types: set[str],
        functions: set[str],
        fields: Set[str] = frozenset(),
    ) -> None:
        self.module, self.types, self.functions = module, types, functions
        # The fields of `self` that hold rows, in a method of their class.
        self.fields = fields
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
            case ast.Attribute(value=ast.Name(id="self"), attr=field) if field in self.fields:
                return True
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


def row_fields(
    module: _Module, cls: ast.ClassDef, types: set[str], functions: set[str]
) -> set[str]:
    """The fields of a class's own object that hold rows: annotated with a model in its body
    (a dataclass's field) or in a method (`self.trial: Trial`), or assigned a row in a method
    (`self.trial = get_trial(...)`, or another such field)."""
    fields = {
        node.target.id
        for node in cls.body
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and module.mentions(node.annotation, types)
    }
    methods = [list(ast.walk(method)) for method in _methods(cls)]
    # To a fixed point: a field assigned from another found later holds rows too.
    known = -1
    while known < len(fields):
        known = len(fields)
        for nodes in methods:
            rows = _Rows(module, nodes, types, functions, fields)
            for node in nodes:
                if isinstance(node, ast.AnnAssign) and module.mentions(node.annotation, types):
                    fields |= _self_fields(node.target)
                for target, value in _bindings(node):
                    if rows.holds(value):
                        fields |= _self_fields(target)
    return fields


def _methods(cls: ast.ClassDef) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _self_fields(target: ast.expr) -> set[str]:
    """The fields of `self` an assignment's target binds (`self.trial`, `self.a, self.b`)."""
    match target:
        case ast.Attribute(value=ast.Name(id="self"), attr=field):
            return {field}
        case ast.Tuple(elts=elements) | ast.List(elts=elements):
            return {field for element in elements for field in _self_fields(element)}
        case ast.Starred(value=inner):
            return _self_fields(inner)
    return set()


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
        # The row fields of each method's class, by the method's node.
        fields_of: dict[int, set[str]] = {}
        for cls in ast.walk(module.tree):
            if isinstance(cls, ast.ClassDef):
                fields = row_fields(module, cls, types, functions)
                fields_of |= {id(method): fields for method in _methods(cls)}
        for nodes in scopes(module.tree):
            fields = fields_of.get(id(nodes[0]), set())
            rows = _Rows(module, nodes, types, functions, fields)
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
        "gpumux/scheduling/reaper.py",
        "def sneak(session: Session, trial_id: int) -> None:\n"
        "    if (trial := trial_store.get_trial(session=session, trial_id=trial_id)):\n"
        "        trial.pid, trial.pid_started = 1, 2",
    ),
    (
        "gpumux/scheduling/reaper.py",
        "def sneak(trial: Trial | None) -> None:\n    trial.error = ''",
    ),
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
    # A row held in a field of the object, set in one method and written in another.
    (
        "gpumux/scheduling/launching.py",
        "class Sneak:\n"
        "    def __init__(self, session: Session) -> None:\n"
        "        self.trial = trial_store.get_trial(session=session, trial_id=1)\n"
        "        self.current = self.trial\n"
        "\n"
        "    def write(self) -> None:\n"
        "        self.current.error = ''",
    ),
    (
        "gpumux/scheduling/next_trials.py",
        "@dataclass\n"
        "class Sneak:\n"
        "    sweep: Sweep\n"
        "\n"
        "    def write(self) -> None:\n"
        "        self.sweep.priority += 1",
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


GATE = "set_trial_status"


def status_moves_outside_storage(package: Path) -> list[str]:
    """Uses of the status gate (`set_trial_status`) outside storage/, called, imported or
    passed on under any name: a move there is a function of `storage/lifecycle.py` named for
    what happened, which decides what the row gets."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).parts[0] == "storage":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            named = (
                {alias.name for alias in node.names}
                if isinstance(node, ast.ImportFrom)
                else {getattr(node, "attr", None), getattr(node, "id", None)}
                if isinstance(node, (ast.Attribute, ast.Name))
                else {node.value}
                if isinstance(node, ast.Constant)
                else set()
            )
            if GATE in named:
                found.append(f"{path.relative_to(package.parent)}:{getattr(node, 'lineno', 0)}")
    return found


def test_no_status_move_passes_fields_from_outside_storage(tmp_path: Path) -> None:
    lifecycle = ast.parse((ROOT / "gpumux/storage/lifecycle.py").read_text())
    assert GATE in {node.name for node in lifecycle.body if isinstance(node, ast.FunctionDef)}
    assert status_moves_outside_storage(ROOT / "gpumux") == []
    root = copy_of_the_package(tmp_path)
    with (root / "gpumux/scheduling/outcomes.py").open("a") as source:
        source.write(
            "\n\ndef sneak(session, trial):\n"
            "    lifecycle.set_trial_status(session=session, trial=trial, status=None, error='')\n"
        )
    with (root / "gpumux/scheduling/reaper.py").open("a") as source:
        source.write(
            "\n\nfrom gpumux.storage.lifecycle import set_trial_status as move\n"
            "\n\ndef sneak_by_name(session, trial):\n"
            "    getattr(lifecycle, 'set_trial_status')(session=session, trial=trial)\n"
        )
    found = status_moves_outside_storage(root / "gpumux")
    assert [where.split(":")[0] for where in found] == [
        "gpumux/scheduling/outcomes.py",
        "gpumux/scheduling/reaper.py",
        "gpumux/scheduling/reaper.py",
    ]
