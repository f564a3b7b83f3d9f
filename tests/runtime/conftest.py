"""Fixtures of the runtime tests: report servers over TCP and over a Unix socket."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import ReportServer, make_handler, serve_reports


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def report_server() -> Iterator[ReportServer]:
    """A report server on 127.0.0.1 (GPUMUX_URL in server.url)."""
    with serve_reports() as server:
        yield server


@pytest.fixture
def unix_report_server(tmp_path: Path) -> Iterator[ReportServer]:
    """A report server on a Unix socket (GPUMUX_URL 'unix:/path' in server.url)."""
    server = ReportServer()
    path = tmp_path / "gpumux.sock"
    httpd = _UnixHTTPServer(str(path), make_handler(server))
    server.url = f"unix:{path}"
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    httpd.shutdown()
    httpd.server_close()
    thread.join()
