"""Settings: the fair-share weights they parse from GPUMUX_SHARES, the database, limits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import make_url

from gpumux.config import (
    MAX_BODY_BYTES,
    MIN_BODY_BYTES,
    RENAMED_SETTINGS,
    Settings,
    SharesError,
    parse_shares,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        ("alice:2,bob:1", {"alice": 2.0, "bob": 1.0}),
        (" alice : 0.5 , bob:3, ", {"alice": 0.5, "bob": 3.0}),
    ],
)
def test_parse_shares(text: str, expected: dict[str, float]) -> None:
    assert parse_shares(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("alice=2", "'alice=2' is not user:weight"),
        (":2", "':2' is not user:weight"),
        ("alice:", "'alice:' is not user:weight"),
        ("alice:lots", "alice's weight 'lots' is not a number"),
        ("alice:0", "weight of alice must be above 0"),
        ("alice:-1", "weight of alice must be above 0"),
        ("alice:inf", "weight of alice must be above 0"),
        ("alice:nan", "weight of alice must be above 0"),
        ("alice:1,alice:2", "alice is given twice"),
    ],
)
def test_parse_shares_refuses(text: str, message: str) -> None:
    with pytest.raises(SharesError) as refused:
        parse_shares(text)
    assert message in str(refused.value)


def test_settings_refuse_unreadable_shares_and_give_the_weights_of_readable_ones() -> None:
    assert Settings(shares="alice:2, bob:0.5").share_weights == {"alice": 2.0, "bob": 0.5}
    with pytest.raises(ValueError, match="bob"):
        Settings(shares="alice:2,bob")


@pytest.mark.parametrize("name", ["gpumux.db", "a b.db", "100%.db", "what?.db", "#1.db"])
def test_a_database_file_of_any_name_is_the_file_the_daemon_and_the_cli_both_see(
    tmp_path: Path, name: str
) -> None:
    settings = Settings(home=tmp_path, db=tmp_path / name)
    assert settings.database_file == tmp_path / name
    # The daemon's dialect reads the URL with SQLAlchemy: the same file.
    assert make_url(settings.database_url).database == str(tmp_path / name)


def test_the_body_limit_is_a_mebibyte_unless_set_and_never_below_its_minimum(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().max_body_bytes == MAX_BODY_BYTES == 1024 * 1024
    monkeypatch.setenv("GPUMUX_MAX_BODY_BYTES", "4194304")
    assert Settings().max_body_bytes == 4 * 1024 * 1024
    monkeypatch.setenv("GPUMUX_MAX_BODY_BYTES", str(MIN_BODY_BYTES - 1))
    with pytest.raises(ValueError, match="max_body_bytes"):
        Settings()


@pytest.mark.parametrize("port", ["-1", "65536", "99999"])
def test_a_port_no_socket_can_have_is_refused(monkeypatch: pytest.MonkeyPatch, port: str) -> None:
    monkeypatch.setenv("GPUMUX_PORT", port)
    with pytest.raises(ValueError, match="port"):
        Settings()


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED_SETTINGS.items()))
def test_a_setting_under_its_old_name_is_refused_with_its_new_one(
    monkeypatch: pytest.MonkeyPatch, old: str, new: str
) -> None:
    default = Settings().model_dump()[new]
    # Read case-insensitively, as every GPUMUX_ variable is.
    monkeypatch.setenv(f"gpumux_{old}", str(default))
    with pytest.raises(ValueError, match=f"GPUMUX_{old.upper()} is now GPUMUX_{new.upper()}"):
        Settings()
    monkeypatch.delenv(f"gpumux_{old}")
    with pytest.raises(ValueError, match=f"GPUMUX_{old.upper()} is now GPUMUX_{new.upper()}"):
        Settings(**{old: default})
    assert Settings(**{new: default}).model_dump()[new] == default


def test_the_cli_names_the_new_setting_and_exits_as_for_any_bad_setting(tmp_path: Path) -> None:
    env = {**os.environ, "GPUMUX_HOME": str(tmp_path), "GPUMUX_WARM_PRELOAD": "tensorflow"}
    done = subprocess.run(
        [sys.executable, "-m", "gpumux", "ls"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.strip()
        == "error: GPUMUX_WARM_PRELOAD is now GPUMUX_PRELOAD: set that one instead"
    )
