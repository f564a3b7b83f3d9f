"""The typer app: global options, user errors as one red line, and `--` for `gpumux sweep`."""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Annotated, ParamSpec

import typer

from gpumux import __version__
from gpumux.cli import commands, export, nodes, profiles, token, top, tune
from gpumux.cli.helptext import PlainCommand, PlainGroup
from gpumux.cli.state import (
    EXIT_USAGE,
    CliError,
    CliState,
    DaemonRunner,
    get_state,
    not_utf8,
    print_error,
)
from gpumux.cli.sweep import SWEEP_HELP, sweep
from gpumux.client import ApiError, DaemonUnreachable, InvalidDaemonUrl, InvalidToken
from gpumux.grammar.sweepspec import SpecError
from gpumux.home.tokenfile import TokenFileError

# The daemon answers these for a request it finds malformed: the user's input, so exit 2.
BAD_INPUT_STATUSES = (400, 422)
P = ParamSpec("P")


def user_errors(command: Callable[P, None]) -> Callable[P, None]:
    """Wrap a command so that errors the user can fix end as one red line, not a traceback."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            command(*args, **kwargs)
            return
        except CliError as error:
            message, code = str(error), error.exit_code
        except (SpecError, InvalidDaemonUrl, InvalidToken) as error:
            message, code = str(error), EXIT_USAGE
        except ApiError as error:
            message = str(error)
            code = EXIT_USAGE if error.status_code in BAD_INPUT_STATUSES else 1
        except (DaemonUnreachable, TokenFileError) as error:
            message, code = str(error), 1
        print_error(message)
        raise typer.Exit(code)

    return run


app = typer.Typer(
    name="gpumux",
    help="Hyper-parameter sweeps packed onto every GPU of a host, each trial in its own slice.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    cls=PlainGroup,
)


def _print_version(value: bool) -> None:
    if value:
        print(f"gpumux {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option(help="the daemon: http://HOST:PORT or unix:/path (default GPUMUX_URL)"),
    ] = None,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="print the version"),
    ] = False,
) -> None:
    get_state(ctx).url = url


app.command(help=SWEEP_HELP, cls=PlainCommand)(user_errors(sweep))
for command in (
    commands.serve,
    commands.ls,
    commands.show,
    commands.cancel,
    commands.logs,
    commands.best,
    nodes.devices,
    nodes.nodes,
    top.top,
    export.export,
    profiles.profiles,
    tune.tune,
):
    app.command(cls=PlainCommand)(user_errors(command))

token_app = typer.Typer(
    help="API tokens, for reaching the daemon over TCP (made over its Unix socket).",
    no_args_is_help=True,
    cls=PlainGroup,
)
token_app.command(cls=PlainCommand)(user_errors(token.create))
token_app.command(cls=PlainCommand)(user_errors(token.revoke))
app.add_typer(token_app, name="token")


def split_command(args: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """Split `gpumux sweep|tune ... -- COMMAND` at the first `--` (click would swallow it)."""
    args = list(args)
    if "--" in args:
        cut = args.index("--")
        if {"sweep", "tune"} & set(args[:cut]):
            return args[:cut], args[cut + 1 :]
    return args, None


def require_utf8_arguments(args: Sequence[str]) -> None:
    """Exit 2 with one line naming the first argument that is not valid UTF-8."""
    for number, arg in enumerate(args, start=1):
        shown = not_utf8(arg)
        if shown is not None:
            print_error(
                f"argument {number} ({shown}) is not valid UTF-8; gpumux takes its arguments, "
                "and the command it runs, as UTF-8 text"
            )
            raise SystemExit(EXIT_USAGE)


def main(argv: Sequence[str] | None = None, *, daemons: DaemonRunner | None = None) -> None:
    """Run the command line on `argv`, able to start the `daemons` given (gpumux.main)."""
    given = sys.argv[1:] if argv is None else argv
    # Checked before click parses them: every argument ends up in a JSON request or a message.
    require_utf8_arguments(given)
    args, command = split_command(given)
    # A closed terminal (SIGHUP) or a kill (SIGTERM) takes Ctrl-C's path: an embedded daemon
    # then stops and requeues its trials instead of leaving them running unsupervised.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.default_int_handler)
    app(args=args, obj=CliState(command=command, daemons=daemons), prog_name="gpumux")
