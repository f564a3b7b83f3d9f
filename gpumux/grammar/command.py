"""A sweep's command as a template: the `{name}` placeholders a parameter fills, the rest of a
trial's parameters appended as flags."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from gpumux.grammar.sweepspec import SpecError, Value, format_value
from gpumux.text import QUOTE_CHARS, cut

# `{name}` is filled with the parameter; `{{name}}` is the literal text `{name}`; any other
# brace is left alone (so that code such as {'a': {'b': 1}} passes unchanged).
_PLACEHOLDER = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_-]*)\}\}|\{([A-Za-z_][A-Za-z0-9_-]*)\}")


def check_placeholders(command: Sequence[str], names: Sequence[str]) -> None:
    """Refuse a `{name}` in the command that names no parameter, saying which there are."""
    known = set(names)
    for index, word in enumerate(command):
        for match in _PLACEHOLDER.finditer(word):
            name = match.group(2)
            if name is not None and name not in known:
                listed, shown = cut(", ".join(names), QUOTE_CHARS), cut(name, QUOTE_CHARS)
                there = f"the parameters are {listed}" if names else "there are none"
                raise SpecError(
                    f"command word {index}: {{{shown}}} names no parameter ({there}); "
                    f"write {{{{{shown}}}}} for the literal text {{{shown}}}",
                    token=f"{{{name}}}",
                )


def render_command(command: Sequence[str], params: Mapping[str, Value]) -> list[str]:
    """The trial's argv: `{name}` placeholders filled, other params appended as --name=value;
    `{{name}}` is the literal `{name}`."""
    used: set[str] = set()

    def fill(match: re.Match[str]) -> str:
        escaped, name = match.group(1), match.group(2)
        if escaped is not None:
            return f"{{{escaped}}}"
        if name not in params:
            # Stored before placeholders were checked at submission: left as it was.
            return match.group(0)
        used.add(name)
        return format_value(params[name])

    argv = [_PLACEHOLDER.sub(fill, arg) for arg in command]
    return argv + [f"--{name}={format_value(v)}" for name, v in params.items() if name not in used]
