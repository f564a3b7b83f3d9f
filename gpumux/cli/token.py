"""`gpumux token`: API tokens for reaching the daemon over TCP (made over its Unix socket)."""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from gpumux.cli.connect import connect
from gpumux.cli.state import EXIT_USAGE, CliError, get_state, validation_message
from gpumux.home import tokenfile
from gpumux.schemas.tokens import TokenCreate

Url = Annotated[
    str | None, typer.Option(help="the daemon's Unix socket, unix:/path (default GPUMUX_URL)")
]


def check_user_name(user: str | None) -> None:
    """CliError (exit 2) when the daemon would refuse `user` as a user's name."""
    try:
        TokenCreate(user=user)
    except ValidationError as error:
        raise CliError(validation_message(error), EXIT_USAGE) from error


def create(
    ctx: typer.Context,
    user: Annotated[
        str | None, typer.Argument(help="whose token (root: anyone's; default: yours)")
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option(help="where to keep your own token (default ~/.config/gpumux/token)"),
    ] = None,
    url: Url = None,
) -> None:
    """Make a token: yours is kept in a 0600 file the CLI finds; another user's is printed."""
    state = get_state(ctx)
    check_user_name(user)
    with connect(state, url) as client:
        created = client.create_token(user)
    if created.user != getpass.getuser():
        state.out.print(created.token)
        state.note(
            f"a token for {created.user}, shown once: give it to them to keep in "
            "~/.config/gpumux/token (chmod 600), or in GPUMUX_TOKEN"
        )
        return
    path = file or tokenfile.token_path()
    try:
        tokenfile.write_token_file(path, created.token)
    except OSError as error:
        raise CliError(f"cannot write the token file {path}: {error.strerror}") from error
    state.note(f"your token is in {path}; gpumux sends it over TCP (revoke: gpumux token revoke)")


def revoke(
    ctx: typer.Context,
    user: Annotated[
        str | None, typer.Argument(help="whose tokens (admins: anyone's; default: yours)")
    ] = None,
    url: Url = None,
) -> None:
    """Revoke every token of a user: requests carrying them get 401 from now on."""
    state = get_state(ctx)
    # An empty name is refused, not taken for the default: it would revoke the caller's own.
    whose = getpass.getuser() if user is None else user
    check_user_name(whose)
    with connect(state, url) as client:
        revoked = client.revoke_tokens(whose)
    state.note(f"revoked {revoked.revoked} tokens of {revoked.user}")
