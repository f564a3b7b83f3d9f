"""What the daemon shows of what a client sent, in its answers and its log: bounded and escaped."""

from __future__ import annotations

from starlette.types import Scope

from gpumux.text import escaped

# A name a client chose (a field, a dict key, a method) as an answer or the log shows it.
NAME_CHARS = 64
# A request's path as the log shows it.
PATH_CHARS = 256


def shown(text: str, limit: int = NAME_CHARS) -> str:
    """`text` cut to `limit` characters (then "…"), each character that is not printable
    (a control character, a line break, an unpaired surrogate) written as its escape, so that
    what a client sent can neither forge a log line nor grow an answer without bound."""
    return escaped(text, limit)


def shown_path(scope: Scope) -> str:
    """The scope's path (percent-decoded by the server, so it may hold any character) for the
    log."""
    return shown(scope["path"], PATH_CHARS)
