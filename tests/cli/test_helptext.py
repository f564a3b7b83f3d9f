"""The help's type column, drawn through typer's own path: the user's words, and no method of
typer's replaced on a parameter to get them."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer.rich_utils
from typer.testing import CliRunner

from gpumux.cli.app import app

# typer's type labels and number ranges, which a user does not type.
TYPE_LABELS = re.compile(r"<(bool|str|int|float|path|list|int range|float range)[^>]*>|<=x|x>=")


def test_help_names_values_plainly_without_shadowing_a_method_of_typer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shadowed: set[str] = set()
    draw = typer.rich_utils._print_options_panel

    def drawing(**panel: Any) -> None:
        for param in panel["params"]:
            methods = {name for name in dir(type(param)) if callable(getattr(type(param), name))}
            shadowed.update(methods & set(vars(param)))
        draw(**panel)

    monkeypatch.setattr(typer.rich_utils, "_print_options_panel", drawing)
    result = CliRunner().invoke(app, ["show", "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    assert re.search(r"--trial +TRIAL ", result.output), result.output
    assert "[SWEEP]" in result.output and not TYPE_LABELS.search(result.output), result.output
    assert shadowed == set()
