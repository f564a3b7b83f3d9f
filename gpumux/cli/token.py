"""`gpumux token`: API tokens for reaching the daemon over TCP (made over its Unix socket)."""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Annotated

import typer

from gpumux import tokenfile
from gpumux.cli.connect import connect
from gpumux.cli.state import CliError, get_state

Url = Annotated[
    str | None, typer.Option(help="the daemon's Unix socket, unix:/path (default GPUMUX_URL)")
]


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
    with connect(state, url) as client:
        revoked = client.revoke_tokens(user or getpass.getuser())
    state.note(f"revoked {revoked.revoked} tokens of {revoked.user}")
