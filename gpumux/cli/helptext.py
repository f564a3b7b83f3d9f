"""Help that names each value as the user writes it (SWEEP, N, FILE), never by typer's labels.

typer's help shows a type column (`<bool>` for a flag, `<int range>` and `[1<=x<=...]` for an
id, `<str>`): labels of its internals, not words a user types. Each command's help here shows an
option's metavar (its name in capitals when it has none), nothing for a flag or for an argument
(whose metavar its name column already shows), and no range; the values are checked as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption


def label(param: TyperArgument | TyperOption) -> str | None:
    """What the help's type column shows for `param`."""
    if isinstance(param, TyperOption) and not param.is_flag:
        return param.metavar or (param.name or "").upper()
    return None


@contextmanager
def plain_labels(params: Iterable[object]) -> Iterator[None]:
    """While the help is drawn, each parameter's type column shows `label(param)` and no range.

    typer draws the column from two methods of the parameter; they are shadowed on the
    instances for as long as the help takes, and given back after.
    """
    shadowed = [p for p in params if isinstance(p, TyperArgument | TyperOption)]
    for param in shadowed:
        shown = label(param)
        vars(param)["display_type_rich"] = lambda ctx, shown=shown: shown
        vars(param)["_get_number_range_help_str"] = lambda: None
    try:
        yield
    finally:
        for param in shadowed:
            vars(param).pop("display_type_rich", None)
            vars(param).pop("_get_number_range_help_str", None)


class PlainCommand(TyperCommand):
    """A command whose help names values by their metavars (see the module); an argument given
    none is named by its name in capitals ("USER", not "user" or "{user}")."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, TyperArgument) and param.metavar is None:
                param.metavar = (param.name or "").upper()

    # Any: typer's context and formatter classes are click's, or its own copy of click's.
    def format_help(self, ctx: Any, formatter: Any) -> None:
        with plain_labels(self.get_params(ctx)):
            super().format_help(ctx, formatter)


class PlainGroup(TyperGroup):
    """A group whose help names values by their metavars (see the module)."""

    # Any: typer's context and formatter classes are click's, or its own copy of click's.
    def format_help(self, ctx: Any, formatter: Any) -> None:
        with plain_labels(self.get_params(ctx)):
            super().format_help(ctx, formatter)
