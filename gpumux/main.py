"""The `gpumux` console script: the command line, handed the daemon it may start.

The one module that joins the command line to the server. The CLI never imports the server
or the storage (an import-linter contract); it is given this runner instead.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from gpumux.cli.app import main as run_cli
from gpumux.cli.state import EmbeddedDaemon, print_error
from gpumux.config import Settings
from gpumux.text import escaped

# How much of an unforeseen exception's message the one line quotes.
SUMMARY_CHARS = 200


class ServerDaemons:
    """The server's daemons, imported on first use: uvicorn and FastAPI take a while to import
    and most commands only talk to a daemon that already runs."""

    def serve_forever(self, settings: Settings) -> None:
        from gpumux.server import daemon

        daemon.serve_forever(settings)

    @contextmanager
    def embedded(self, settings: Settings) -> Iterator[EmbeddedDaemon]:
        from gpumux.server import daemon

        with daemon.embedded(settings) as running:
            yield running


def write_traceback(error: BaseException) -> str:
    """The traceback of `error` in an owner-only file of its own; the file's path."""
    descriptor, path = tempfile.mkstemp(prefix="gpumux-traceback-", suffix=".txt")
    with os.fdopen(descriptor, "w", errors="backslashreplace") as file:
        file.write("".join(traceback.format_exception(error)))
    return path


def summary(error: BaseException) -> str:
    """The exception's type and the start of its message's first line, as one short line."""
    # The message may quote an argument of any length and of any characters (escapes for the
    # terminal among them): the traceback file has all of it.
    first = (str(error).splitlines() or [""])[0]
    return f"{type(error).__name__}: {escaped(first, SUMMARY_CHARS)}"


def main(argv: Sequence[str] | None = None) -> None:
    """`gpumux ...`; a failure no command foresaw ends in one line and exit 1, not a traceback."""
    try:
        run_cli(argv, daemons=ServerDaemons())
    except Exception as error:
        # Usage errors, user errors, exits and Ctrl-C (KeyboardInterrupt is no Exception) took
        # their own paths already; what is left is a bug, and its traceback is for a report.
        try:
            where = f"its traceback is in {write_traceback(error)}"
        except OSError as unwritten:
            where = f"its traceback could not be written ({unwritten.strerror})"
        print_error(
            f"gpumux failed unexpectedly ({summary(error)}); {where}: please "
            "report it with the command you ran"
        )
        raise SystemExit(1) from None
