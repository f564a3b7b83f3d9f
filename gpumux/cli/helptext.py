"""Help that names each value as the user writes it (SWEEP, N, FILE), never by typer's labels.

typer's help shows a type column (`<bool>` for a flag, `<int range>` and `[1<=x<=...]` for an
id, `<str>`): labels of its internals, not words a user types. Each command's help here shows an
option's metavar (its name in capitals when it has none), nothing for a flag or for an argument
(whose metavar its name column already shows), and no range; the values are checked as before.

typer draws that column from two methods of each parameter (typer 0.29: `display_type_rich`,
`_get_number_range_help_str`). A plain command's parameters are of subclasses that override
them, so that nothing is replaced on a parameter while its help is drawn
(tests/cli/test_helptext.py fails where a typer upgrade renames them).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption


def label(param: TyperArgument | TyperOption) -> str | None:
    """What the help's type column shows for `param`."""
    if isinstance(param, TyperOption) and not param.is_flag:
        return param.metavar or (param.name or "").upper()
    return None


class PlainArgument(TyperArgument):
    """An argument whose help shows no type column (its name column shows its metavar)."""

    # Any: typer's context class is click's, or its own copy of click's.
    def display_type_rich(self, ctx: Any) -> str | None:
        return label(self)

    def _get_number_range_help_str(self) -> str | None:
        return None


class PlainOption(TyperOption):
    """An option whose help shows its metavar, or nothing for a flag, and no range."""

    # Any: typer's context class is click's, or its own copy of click's.
    def display_type_rich(self, ctx: Any) -> str | None:
        return label(self)

    def _get_number_range_help_str(self) -> str | None:
        return None


def plain(params: Iterable[object | None]) -> None:
    """Make typer's parameters `params` plain ones: the same state, the overrides above."""
    for param in params:
        if isinstance(param, TyperOption):
            param.__class__ = PlainOption
        elif isinstance(param, TyperArgument):
            param.__class__ = PlainArgument


class PlainCommand(TyperCommand):
    """A command whose help names values by their metavars (see the module); an argument given
    none is named by its name in capitals ("USER", not "user" or "{user}")."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, TyperArgument) and param.metavar is None:
                param.metavar = (param.name or "").upper()
        plain(self.params)

    # Any: typer's context and option classes are click's, or its own copy of click's.
    def get_help_option(self, ctx: Any) -> Any:
        """--help, made as the other options are: a plain one."""
        option = super().get_help_option(ctx)
        plain([option])
        return option


class PlainGroup(TyperGroup):
    """A group whose help names values by their metavars (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        plain(self.params)

    # Any: typer's context and option classes are click's, or its own copy of click's.
    def get_help_option(self, ctx: Any) -> Any:
        """--help, made as the other options are: a plain one."""
        option = super().get_help_option(ctx)
        plain([option])
        return option
