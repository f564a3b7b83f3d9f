"""Text gpumux was given, as it shows it to people and logs: cut short and escaped (pure).

The one home of the rule: what is cut ends in "…"; what is escaped keeps every printable
character and writes the others (control characters, line breaks, lone surrogates) as their
Python escapes, so that a value can neither forge a line nor grow a message without bound.
"""

from __future__ import annotations

ELLIPSIS = "…"
# What a message quotes of a value that was sent: enough to recognise it, never all of it.
QUOTE_CHARS = 60


def cut(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and an ellipsis."""
    return text if len(text) <= limit else text[:limit] + ELLIPSIS


def quoted(text: str, limit: int = QUOTE_CHARS) -> str:
    """`text` as a message quotes it: the repr of `cut(text, limit)`, escaped and in quotes,
    the ellipsis inside them where cut."""
    return repr(cut(text, limit))


def escaped(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, each one that is not printable written as its escape."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in cut(text, limit))


def first_line(text: str, limit: int) -> str:
    """The first line of another program's message (what it says first), cut to `limit`."""
    return cut((text.strip().splitlines() or [""])[0], limit)
