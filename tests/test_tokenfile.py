"""The token file: private, written whole, refused when others can read it; token discovery."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpumux.home.tokenfile import (
    TokenFileError,
    discover_token,
    read_token_file,
    token_path,
    write_token_file,
)


def test_token_path_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert token_path() == tmp_path / "config" / "gpumux" / "token"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert token_path() == tmp_path / "home" / ".config" / "gpumux" / "token"


def test_token_file_is_private_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "config" / "gpumux" / "token"
    write_token_file(path, "gmx_secret")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text() == "gmx_secret\n"
    assert read_token_file(path) == "gmx_secret"


def test_rewriting_replaces_a_loose_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("gmx_old\n")
    path.chmod(0o644)
    write_token_file(path, "gmx_new")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_token_file(path) == "gmx_new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["token"]  # no temporary left


def test_missing_or_empty_token_file_reads_as_none(tmp_path: Path) -> None:
    assert read_token_file(tmp_path / "absent") is None
    empty = tmp_path / "empty"
    empty.touch(mode=0o600)
    assert read_token_file(empty) is None


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o666])
def test_a_token_file_open_to_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "token"
    write_token_file(path, "gmx_secret")
    os.chmod(path, mode)
    with pytest.raises(TokenFileError) as refused:
        read_token_file(path)
    assert f"{mode:04o}" in str(refused.value)
    assert f"chmod 600 {path}" in str(refused.value)


def test_a_client_finds_the_environment_then_its_file_then_the_daemons_token(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("GPUMUX_TOKEN", raising=False)
    home = tmp_path / "data"
    assert discover_token(home) is None
    write_token_file(home / "token", "gmx_daemon")
    assert discover_token(home) == "gmx_daemon"
    write_token_file(token_path(), "gmx_mine")
    assert discover_token(home) == "gmx_mine"
    monkeypatch.setenv("GPUMUX_TOKEN", "gmx_env")
    assert discover_token(home) == "gmx_env"
