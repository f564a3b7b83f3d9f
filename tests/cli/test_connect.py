"""Finding the daemon: the named one, the one in the lock file, a shared server's socket."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumux.cli import connect
from gpumux.client import DaemonUnreachable
from gpumux.config import Settings
from gpumux.server.daemon import embedded


def test_with_no_url_named_the_shared_servers_socket_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "run" / "gpumux.sock"
    shared.parent.mkdir()
    monkeypatch.setattr(connect, "SHARED_SOCKET", shared)
    mine = Settings(home=tmp_path / "mine")
    with pytest.raises(DaemonUnreachable):
        connect.find_daemon(mine.url, mine)
    with embedded(Settings(home=tmp_path / "server", url=f"unix:{shared}")):
        with connect.find_daemon(mine.url, mine) as client:
            assert client.url == f"unix:{shared}"
            assert client.health().status == "ok"
        named = Settings(home=tmp_path / "mine", url=f"unix:{tmp_path / 'elsewhere.sock'}")
        with pytest.raises(DaemonUnreachable):
            connect.find_daemon(named.url, named)
