"""The README's commands, as a newcomer copies them: each `gpumux` call names a command, options
and arguments the CLI has (typer's own click parses it as `gpumux` would; nothing runs), and the
walk-through chains: one daemon started once, sweeps found by the names given them, no id to
guess."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from typer._click.core import Command
from typer._click.exceptions import UsageError
from typer.core import TyperGroup

from gpumux.cli.app import app, split_command
from gpumux.cli.state import CliState

README = Path(__file__).resolve().parents[1] / "README.md"
# A $(...) substitution stands for one word where it is (an id, when parsed); its own command is
# checked too.
SUBSTITUTION = re.compile(r"\$\(([^()]*)\)")
SUBSTITUTED = "$(...)"
# Shell words that end one command and start the next.
SEPARATORS = {"&&", "&", ";", "||", "|"}
# A redirection: alone, its file is the next word.
REDIRECTION = re.compile(r"\d*(>>?|<)(\S*)")
# The commands whose argument names a sweep or a trial: by a name or a substitution, never by
# a number that only a fresh HOME run in the README's order would give.
REFERENCES = {"show", "best", "cancel", "export", "logs"}


def bash_lines() -> list[str]:
    """Each command line of the README's bash blocks, continuation lines joined."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    return [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]


def gpumux_calls(line: str) -> list[list[str]]:
    """The `gpumux ...` calls of one line, substitutions first, as argument lists."""
    inner = [call for found in SUBSTITUTION.findall(line) for call in gpumux_calls(found)]
    lexer = shlex.shlex(
        SUBSTITUTION.sub(shlex.quote(SUBSTITUTED), line), posix=True, punctuation_chars="&;|"
    )
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    words = iter(lexer)
    for word in words:
        if word in SEPARATORS:
            commands.append([])
        elif found := REDIRECTION.fullmatch(word):
            if not found.group(2):
                next(words)
        else:
            commands[-1].append(word)
    return inner + [words[1:] for words in commands if words[:1] == ["gpumux"]]


CALLS = [call for line in bash_lines() for call in gpumux_calls(line)]


def parse(args: list[str]) -> list[str]:
    """Parse `gpumux ARGS` as the console script would, through its subcommands, without
    running any; the names of the commands it went through."""
    before, command = split_command(["1" if word == SUBSTITUTED else word for word in args])
    group = typer.main.get_command(app)
    ctx = group.make_context("gpumux", list(before), obj=CliState(command=command))
    names = []
    current: Command = group
    while isinstance(current, TyperGroup):
        rest = [*ctx._protected_args, *ctx.args]
        name, found, rest = current.resolve_command(ctx, rest)
        assert found is not None and name is not None
        names.append(name)
        ctx = found.make_context(name, rest, parent=ctx)
        current = found
    return names


def test_the_readme_has_a_walk_through_to_check() -> None:
    assert len(CALLS) >= 15, CALLS
    assert ["sweep"] in [parse(call) for call in CALLS]


@pytest.mark.parametrize("args", CALLS, ids=[" ".join(call) for call in CALLS])
def test_each_gpumux_call_parses_as_the_cli_would(args: list[str]) -> None:
    try:
        parse(args)
    except UsageError as error:
        pytest.fail(f"gpumux {shlex.join(args)}: {error.format_message()}")


def test_one_daemon_is_started_and_every_sweep_is_named_before_it_is_used() -> None:
    serves = [call for call in CALLS if call[:1] == ["serve"]]
    assert len(serves) == 1, f"the daemon is started once: {serves}"
    named: set[str] = set()
    for call in CALLS:
        command, *rest = call
        if command == "sweep" and "--name" in rest:
            named.add(rest[rest.index("--name") + 1])
        if command in REFERENCES:
            reference = next(word for word in rest if not word.startswith("-"))
            assert not reference.isdecimal(), (
                f"gpumux {shlex.join(call)}: an id a newcomer would have to guess"
            )
            if reference != SUBSTITUTED:
                assert reference in named, f"gpumux {shlex.join(call)}: no sweep named so yet"
