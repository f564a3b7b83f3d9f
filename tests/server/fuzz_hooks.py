"""Schemathesis hooks for test_fuzz.py.

Where the daemon runs as the test's own user it runs the command of every sweep it accepts, as
that user: unless test_fuzz.py says the daemon has an account of its own (RUN_COMMANDS), each
command that could be accepted becomes /bin/true before it is sent, and the rest of the sweep
stays fuzzed.

Each long pattern of the schema is read as the same language spelled so that schemathesis keeps
its length limit apart from it (FOLD_LIMIT).
"""

from __future__ import annotations

import os
import re
from typing import Any

import schemathesis

HARMLESS = "/bin/true"
# Set (to 1) by test_fuzz.py (its RUN_COMMANDS) where the daemon runs as an account made for
# the test.
RUN_COMMANDS = "GPUMUX_FUZZ_RUN_COMMANDS"
# Schemathesis writes a string's maxLength into its pattern for generation (`^[^\x00]*$` and
# maxLength 131071 become `^[^\x00]{0,131071}$`), and its regex engine takes seconds to compile
# each such pattern: 7 s of CPU a POST /sweeps case, 28 s of its first. A pattern P is sent as
# `(?:P)|(?:P)`, which matches what P matches and which schemathesis does not rewrite: the bound
# stays a maxLength of its own. Bounds up to this many characters compile in milliseconds and
# keep the rewrite, which draws strings of every allowed length.
FOLD_LIMIT = 1000


def _unfold(node: Any) -> None:
    """Spell each pattern whose string may be longer than FOLD_LIMIT as an alternation of itself."""
    if isinstance(node, dict):
        pattern, longest = node.get("pattern"), node.get("maxLength")
        if isinstance(pattern, str) and isinstance(longest, int) and longest > FOLD_LIMIT:
            node["pattern"] = _alternation(pattern)
        for value in node.values():
            _unfold(value)
    elif isinstance(node, list):
        for value in node:
            _unfold(value)


def _alternation(pattern: str) -> str:
    """`(?:P)|(?:P)`; P itself where that would not compile the same (a named group twice, a
    flag after the start), lest schemathesis drop the pattern unsaid."""
    doubled = f"(?:{pattern})|(?:{pattern})"
    try:
        if re.compile(pattern).groups == 0:
            re.compile(doubled)
            return doubled
    except re.error:
        pass
    return pattern


@schemathesis.hook
def before_load_schema(context: schemathesis.HookContext, raw_schema: dict[str, Any]) -> None:
    """Keep long strings' lengths out of their patterns (FOLD_LIMIT)."""
    _unfold(raw_schema)


@schemathesis.hook
def before_call(
    context: schemathesis.HookContext, case: schemathesis.Case, kwargs: dict[str, Any]
) -> None:
    """Send /bin/true as the command of a sweep whose command is a list of strings."""
    if os.environ.get(RUN_COMMANDS) == "1":
        return
    if case.operation.method.upper() != "POST" or case.operation.path != "/sweeps":
        return
    body = case.body
    if not isinstance(body, dict):
        return
    command = body.get("command")
    # A command that is not a list of strings is refused anyway: left as it is, it stays the
    # invalid input it was generated to be.
    if isinstance(command, list) and command and all(isinstance(word, str) for word in command):
        body["command"] = [HARMLESS]
