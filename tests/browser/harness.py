"""A real `gpumux serve` and the system's Chromium, for the dashboard's test and its screenshot."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from ports import free_port

from gpumux.home import tokenfile

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Playwright, ViewportSize

CHROMIUM = Path("/usr/bin/chromium")
# No sandbox (tests run as root in containers), no GPU, and no traffic beyond the page's own.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT: ViewportSize = {"width": 1280, "height": 800}


def launch(playwright: Playwright) -> Browser:
    """Debian's Chromium, headless: Playwright downloads no browser of its own."""
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)


@dataclass(frozen=True)
class Served:
    """A running daemon: where it listens, and the token it keeps for its own user."""

    url: str
    token: str | None

    @property
    def headers(self) -> dict[str, str]:
        """What a client sends over TCP to be the daemon's user."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def page(self, fragment: str = "") -> str:
        """The dashboard's address, carrying the token as a user would paste it."""
        query = f"?token={self.token}" if self.token else ""
        return f"{self.url}/ui/{query}{fragment}"


@contextmanager
def daemon(home: Path, settings: Mapping[str, str]) -> Iterator[Served]:
    """`gpumux serve` on a free TCP port with its data in `home`."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("GPUMUX_")}
    env.update(settings)
    port = free_port()
    home.mkdir(parents=True, exist_ok=True)
    with open(home.parent / "daemon.log", "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "gpumux", "serve", "--host", "127.0.0.1"]
            + ["--port", str(port), "--home", str(home)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        assert server.stdout is not None
        try:
            # Printed once the socket listens: from then on a request waits in its backlog.
            line = server.stdout.readline()
            url = f"http://127.0.0.1:{port}"
            assert line.startswith(f"gpumux: serving on {url}"), line
            assert httpx.get(f"{url}/health", timeout=30).json()["status"] == "ok"
            yield Served(url, tokenfile.daemon_token(home))
        finally:
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
            server.stdout.close()
            server.wait(timeout=60)


def submit(served: Served, workdir: Path, command: list[str], **fields: Any) -> int:
    """Submit a sweep running `command` in `workdir`; its id."""
    body = {"command": command, "workdir": str(workdir), "env": dict(os.environ), **fields}
    response = httpx.post(f"{served.url}/sweeps", json=body, headers=served.headers, timeout=30)
    assert response.status_code == 201, response.text
    return int(response.json()["id"])
