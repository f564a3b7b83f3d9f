"""Reports reach the daemon over TCP or a Unix socket; a daemon that refuses them costs one line."""

from __future__ import annotations

import math
import socket
from pathlib import Path

import numpy as np
import pytest

from gpumux.runtime.reporter import Reporter, finite_metrics

from .support import FIXTURES, TOKEN, ReportServer, run_python, trial_env


def closed_port_url() -> str:
    """An http:// URL where nothing listens: connecting is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def make_reporter(url: str) -> Reporter:
    return Reporter(url=url, token=TOKEN, trial_id=7, attempt=2)


def test_report_is_posted_with_the_token(report_server: ReportServer) -> None:
    reporter = make_reporter(report_server.url)

    reporter.submit(
        kind="epoch",
        step=1,
        samples=1437,
        seconds=0.5,
        metrics={"loss": np.float32(0.25), "accuracy": 1, "val_loss": math.nan},
    )

    assert reporter.flush(timeout=30)
    assert report_server.requests == [
        {
            "path": "/reports",
            "authorization": f"Bearer {TOKEN}",
            "body": {
                "trial_id": 7,
                "attempt": 2,
                "kind": "epoch",
                "step": 1,
                "samples": 1437.0,
                "seconds": 0.5,
                "metrics": {"loss": 0.25, "accuracy": 1.0},
            },
        }
    ]
    assert (reporter.delivered, reporter.dropped) == (1, 0)


def test_report_over_a_unix_socket(unix_report_server: ReportServer) -> None:
    reporter = make_reporter(unix_report_server.url)

    reporter.submit(kind="manual", step=None, samples=None, seconds=1.0, metrics={"loss": 2})

    assert reporter.flush(timeout=30)
    assert [r["body"]["metrics"] for r in unix_report_server.requests] == [{"loss": 2.0}]


def test_finite_metrics_keeps_finite_numbers_only() -> None:
    metrics = {
        "loss": 0.5,
        "steps": np.int64(3),
        "nan": math.nan,
        "inf": -math.inf,
        "name": "adam",
        "vector": np.zeros(3),
        "none": None,
    }

    assert finite_metrics(metrics) == {"loss": 0.5, "steps": 3.0}


def test_refusing_daemon_drops_and_counts_with_one_warning(
    report_server: ReportServer, capsys: pytest.CaptureFixture[str]
) -> None:
    report_server.status = 500
    reporter = make_reporter(report_server.url)

    for _ in range(3):
        reporter.submit(kind="manual", step=None, samples=1, seconds=1, metrics={})

    assert reporter.flush(timeout=30)
    assert (reporter.delivered, reporter.dropped) == (0, 3)
    assert len(report_server.requests) == 1, "no retry while the daemon just failed"
    assert capsys.readouterr().err == (
        f"gpumux: WARNING: cannot report to the gpumux daemon at {report_server.url} "
        "(HTTP 500 Internal Server Error); training goes on, reports are dropped while the "
        "daemon does not answer\n"
    )


def test_unusable_url_is_one_warning(capsys: pytest.CaptureFixture[str]) -> None:
    reporter = make_reporter("ftp://127.0.0.1/")

    reporter.submit(kind="manual", step=None, samples=1, seconds=1, metrics={})

    assert reporter.flush(timeout=30)
    assert reporter.dropped == 1
    assert "GPUMUX_URL='ftp://127.0.0.1/' is not http://HOST:PORT or unix:/PATH" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("failure", ["http 500", "connection refused"])
def test_trial_survives_a_failing_daemon(
    failure: str, report_server: ReportServer, tmp_path: Path
) -> None:
    report_server.status = 500
    url = report_server.url if failure == "http 500" else closed_port_url()

    result = run_python([str(FIXTURES / "report_some.py")], trial_env(url), tmp_path)

    assert result.returncode == 0, result.stdout
    assert "script: done" in result.stdout
    # The warning comes from the reporter's thread: it may land inside a line of the script's.
    warning = f"gpumux: WARNING: cannot report to the gpumux daemon at {url}"
    assert result.stdout.count("gpumux: WARNING") == 1, result.stdout
    assert warning in result.stdout
