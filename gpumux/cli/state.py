"""What every command shares: the settings, the consoles, the daemon's URL, and user errors."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from gpumux.config import Settings

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A problem the user can fix: printed as one red line, then exit with `exit_code`."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


PIPE_WIDTH = 120


class EmbeddedDaemon(Protocol):
    """A daemon this command runs on a background thread while it needs one."""

    @property
    def url(self) -> str: ...


class DaemonRunner(Protocol):
    """The daemons the command line may start. The entry point (gpumux.main) hands in the
    server's; the command line itself never imports the server or the storage."""

    def serve_forever(self, settings: Settings) -> None: ...

    def embedded(self, settings: Settings) -> AbstractContextManager[EmbeddedDaemon]: ...


@dataclass
class CliState:
    """Built once per run by `main()` (or the app's callback) and handed down through ctx.obj."""

    # The words after the first `--` on the command line (the sweep's COMMAND), if any.
    command: list[str] | None = None
    url: str | None = None
    # No markup or highlighting: parameters, commands and logs are the user's text, not markup.
    out: Console = field(default_factory=lambda: make_console())
    err: Console = field(default_factory=lambda: make_console(stderr=True))
    # The daemons it may start; None where the command line runs without the server.
    daemons: DaemonRunner | None = None
    _settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        """Settings from GPUMUX_* variables, built on first use."""
        if self._settings is None:
            self._settings = build_settings()
        return self._settings

    @property
    def runner(self) -> DaemonRunner:
        """The daemons this command line may start; CliError where it may start none."""
        if self.daemons is None:
            raise CliError("this gpumux command line cannot start a daemon; run `gpumux` itself")
        return self.daemons

    def resolve_url(self, url: str | None) -> str:
        """The daemon's URL: the command's --url, else the global one, else GPUMUX_URL."""
        return url or self.url or self.settings.url

    def note(self, message: str) -> None:
        """Print a status line on stderr, so that stdout stays the command's result."""
        self.err.print(Text(f"gpumux: {message}", style="dim"), soft_wrap=True)


def make_console(*, stderr: bool = False) -> Console:
    """A console for the user's text: no markup or highlighting, and no 80-column pipes."""
    console = Console(stderr=stderr, markup=False, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        # Piped into a log or a file nothing limits the width: rich's 80 would cut the tables.
        console.width = PIPE_WIDTH
    return console


def print_error(message: str) -> None:
    """Print a user-facing error in red on stderr (markup in `message` is not interpreted)."""
    # soft_wrap: one long line that the terminal wraps, not lines broken at 80 columns in a pipe.
    Console(stderr=True).print(Text(f"error: {message}", style="bold red"), soft_wrap=True)


def validation_message(error: ValidationError, label: Callable[[str], str] = str) -> str:
    """A pydantic error as "field: message" lines, each field named as the user knows it."""
    lines = []
    for item in error.errors():
        where = label(".".join(str(part) for part in item["loc"]))
        message = str(item["msg"]).removeprefix("Value error, ")
        lines.append(f"{where}: {message}" if where else message)
    return "\n".join(lines)


def build_settings(**overrides: Any) -> Settings:
    """Settings from GPUMUX_* variables and `overrides`; CliError (exit 2) when one is invalid."""
    try:
        return Settings(**overrides)
    except ValidationError as error:
        message = validation_message(error, lambda field: field and f"GPUMUX_{field.upper()}")
        raise CliError(message, EXIT_USAGE) from error


def get_state(ctx: typer.Context) -> CliState:
    """The run's CliState, created if the app was invoked without main()."""
    root = ctx.find_root()
    if not isinstance(root.obj, CliState):
        root.obj = CliState()
    return root.obj


def finite(value: float | None) -> float | None:
    """A float option's callback: infinity and NaN are refused as a usage error."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter("expected a finite number")
    return value


def not_utf8(text: str) -> str | None:
    """`text` as it can be shown (bad bytes as \\xNN) when it is not valid UTF-8, else None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Python hands undecodable bytes of argv and the environment over as lone surrogates.
        raw = text.encode("utf-8", "surrogateescape")
        return raw.decode("utf-8", "backslashreplace")
    return None
