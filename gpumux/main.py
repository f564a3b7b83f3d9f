"""The `gpumux` console script: the command line, handed the daemon it may start.

The one module that joins the command line to the server. The CLI never imports the server
or the storage (an import-linter contract); it is given this runner instead.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from gpumux.cli.app import main as run_cli
from gpumux.cli.state import EmbeddedDaemon
from gpumux.config import Settings


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


def main(argv: Sequence[str] | None = None) -> None:
    """`gpumux ...`."""
    run_cli(argv, daemons=ServerDaemons())
