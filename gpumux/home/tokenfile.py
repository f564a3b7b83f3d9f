"""The file where a user keeps their API token, and how a client finds one (stdlib only)."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from gpumux.home.layout import Layout


class TokenFileError(RuntimeError):
    """The token file cannot be trusted or read; the message says why and what to do."""


def token_path() -> Path:
    """Where the CLI keeps its token: $XDG_CONFIG_HOME/gpumux/token or ~/.config/gpumux/token."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpumux" / "token"


def write_token_file(path: Path, token: str) -> None:
    """Store the token readable by its owner only (0600, directory 0700 when created here)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # mkstemp creates the file 0600; the rename makes it appear whole or not at all.
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(token + "\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def read_token_file(path: Path) -> str | None:
    """The stored token, None when there is no file; refuses a file other users can open."""
    try:
        file = path.open()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise TokenFileError(f"cannot read the token file {path}: {error.strerror}") from error
    with file:
        # Judged on the open file, so a swap between the check and the read cannot fool it.
        mode = stat.S_IMODE(os.fstat(file.fileno()).st_mode)
        if mode & 0o077:
            raise TokenFileError(
                f"the token file {path} is open to other users (mode {mode:04o}), who could use "
                f"it to act as you: run `chmod 600 {path}`, or revoke it and make a new one"
            )
        token = file.read().strip()
    return token or None


def daemon_token(home: Path) -> str | None:
    """The token a daemon keeps for its own user in its data directory `home`."""
    return read_token_file(Layout(home).daemon_token)


def discover_token(home: Path | None = None) -> str | None:
    """The token a client sends over TCP: $GPUMUX_TOKEN, else the user's token file, else the
    token the daemon keeps for its own user in the data directory `home` (when readable)."""
    from_environment = os.environ.get("GPUMUX_TOKEN", "").strip()
    if from_environment:
        return from_environment
    mine = read_token_file(token_path())
    if mine is not None:
        return mine
    if home is not None:
        # Another user's daemon: its token is not ours to read, and that is no error.
        with contextlib.suppress(TokenFileError):
            return daemon_token(home)
    return None
