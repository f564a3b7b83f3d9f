"""The gpumux source as the boundary tests read it: a copy of the package to break, and the
syntax tree of each function."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def copy_of_the_package(tmp_path: Path) -> Path:
    """A copy of gpumux (its web assets left out) and its pyproject.toml under `tmp_path`."""
    shutil.copytree(ROOT / "gpumux", tmp_path / "gpumux", ignore=shutil.ignore_patterns("web"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def definitions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
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


def scopes(tree: ast.Module) -> list[list[ast.AST]]:
    """The nodes of each of a module's functions and methods (with the functions nested in
    them), and those of the rest of the module (its own statements and its classes')."""
    functions = definitions(tree)
    apart = {id(function) for function in functions}
    rest: list[ast.AST] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        rest.append(node)
        todo += [child for child in ast.iter_child_nodes(node) if id(child) not in apart]
    return [*(list(ast.walk(function)) for function in functions), rest]
