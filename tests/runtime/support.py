"""Helpers of the runtime tests: a recording report server, trial environments, subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import gpumux.runtime

RUNTIME_DIR = Path(gpumux.runtime.__file__).parent
BOOTSTRAP_DIR = RUNTIME_DIR / "bootstrap"
REPO_ROOT = RUNTIME_DIR.parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
EXAMPLES = REPO_ROOT / "examples"
TOKEN = "secret-token-7"
TIMEOUT_S = 300  # a trial subprocess; TensorFlow's import alone takes seconds here


class ReportServer:
    """Records every report POSTed to it; answers each with `status`."""

    def __init__(self) -> None:
        self.status = 200
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.url = ""

    def record(self, path: str, authorization: str | None, body: bytes) -> None:
        """Keep one request (the handler threads call this)."""
        with self.lock:
            self.requests.append(
                {"path": path, "authorization": authorization, "body": json.loads(body)}
            )

    @property
    def reports(self) -> list[dict[str, Any]]:
        """The JSON bodies received so far."""
        with self.lock:
            return [request["body"] for request in self.requests]


def make_handler(server: ReportServer) -> type[BaseHTTPRequestHandler]:
    """A request handler class that records into `server`."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            server.record(self.path, self.headers.get("Authorization"), body)
            self.send_response(server.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: the test output is for the trial's lines."""

    return Handler


@contextlib.contextmanager
def serve_reports() -> Iterator[ReportServer]:
    """A report server on 127.0.0.1 (GPUMUX_URL in server.url) for the block; what it
    recorded stays readable after it."""
    server = ReportServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(server))
    server.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def trial_env(url: str | None, **overrides: str | None) -> dict[str, str]:
    """A trial's environment as the launcher sets it: CPU device, 1 thread, split 2, attempt 2."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("GPUMUX_", "XLA_")) and name not in ("OMP_NUM_THREADS",)
    }
    env.update(
        PYTHONPATH=str(BOOTSTRAP_DIR),
        GPUMUX_TRIAL_ID="7",
        GPUMUX_SWEEP_ID="3",
        GPUMUX_ATTEMPT="2",
        GPUMUX_PARAMS='{"lr": 0.01}',
        GPUMUX_TRIAL_TOKEN=TOKEN,
        GPUMUX_DEVICE_KIND="cpu",
        GPUMUX_FRAMEWORK_DEVICE="cpu",
        CUDA_VISIBLE_DEVICES="",
        GPUMUX_SPLIT="2",
        GPUMUX_CPU_THREADS="1",
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    if url is not None:
        env["GPUMUX_URL"] = url
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def run_python(
    args: list[str], env: dict[str, str], cwd: Path, python: str = sys.executable
) -> subprocess.CompletedProcess[str]:
    """Run a Python process to its end, stdout and stderr interleaved in .stdout."""
    return subprocess.run(
        [python, *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def samples_by_epoch(reports: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """Each epoch's step and its samples, those of the heartbeats sent during it included: a
    slow epoch (a loaded machine) sends a heartbeat with part of its samples."""
    epochs, during = [], 0.0
    for report in reports:
        during += report["samples"] or 0.0
        if report["kind"] == "epoch":
            epochs.append((report["step"], during))
            during = 0.0
    return epochs


def gpumux_lines(output: str) -> list[str]:
    """The lines gpumux itself wrote."""
    return [line for line in output.splitlines() if line.startswith("gpumux:")]
