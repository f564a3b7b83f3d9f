"""Schemathesis hooks for test_fuzz.py where the daemon runs as the test's own user.

Such a daemon runs the command of every sweep it accepts, as that user: each command that could
be accepted becomes /bin/true before it is sent, and the rest of the sweep stays fuzzed.
"""

from __future__ import annotations

from typing import Any

import schemathesis

HARMLESS = "/bin/true"


@schemathesis.hook
def before_call(
    context: schemathesis.HookContext, case: schemathesis.Case, kwargs: dict[str, Any]
) -> None:
    """Send /bin/true as the command of a sweep whose command is a list of strings."""
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
