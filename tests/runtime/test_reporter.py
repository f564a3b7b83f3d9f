"""Reports reach the daemon over TCP or a Unix socket; a daemon that refuses them costs one line."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import numpy as np
import pytest
from builders import stored_running_trial
from ports import free_port

import gpumux.runtime
from gpumux import fields
from gpumux.runtime import reporter as runtime_reporter
from gpumux.runtime.reporter import Reporter, finite_metrics, report_metrics
from gpumux.schemas.reports import ReportIn
from gpumux.storage.engine import Sessions

from .support import FIXTURES, TOKEN, ReportServer, run_python, trial_env


def closed_port_url() -> str:
    """An http:// URL where nothing listens: connecting is refused."""
    return f"http://127.0.0.1:{free_port()}"


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


def test_reports_carry_the_frameworks_pool_read_once_a_second_at_most(
    report_server: ReportServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    reporter = make_reporter(report_server.url)
    clock = [1000.0]
    monkeypatch.setattr(runtime_reporter.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(runtime_reporter.time, "time", lambda: 1.8e9 + clock[0])
    # The framework's pool (bytes), as PyTorch's memory_reserved() tells it: read at each call.
    pool = iter([3 * 2**30 + 5, 5 * 2**30, 6 * 2**30])
    reporter.pool_from(lambda: next(pool))

    for seconds in (0.0, 0.5, 0.6):
        clock[0] += seconds
        reporter.submit(kind="steps", step=None, samples=None, seconds=1.0, metrics={})

    assert reporter.flush(timeout=30)
    # Read at the first report and again a second later, not at the report between; each
    # says when it was read.
    sent = [(r["body"]["pool_mb"], r["body"]["pool_at"]) for r in report_server.requests]
    assert sent == [(3072, 1.8e9 + 1000), (3072, 1.8e9 + 1000), (5120, 1.8e9 + 1001.1)]


def test_a_pool_that_cannot_be_read_is_one_warning_and_reports_go_on(
    report_server: ReportServer, capsys: pytest.CaptureFixture[str]
) -> None:
    reporter = make_reporter(report_server.url)

    def broken() -> int:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    reporter.pool_from(broken)
    for _ in range(2):
        reporter.submit(kind="manual", step=None, samples=5, seconds=1.0, metrics={})

    assert reporter.flush(timeout=30)
    assert [r["body"].get("pool_mb") for r in report_server.requests] == [None, None]
    err = capsys.readouterr().err
    assert err.count("WARNING: the device memory pool cannot be read") == 1
    assert "illegal memory access" in err


def test_the_runtime_knows_the_bounds_of_a_report() -> None:
    step = ReportIn.model_json_schema()["properties"]["step"]["anyOf"][0]
    assert gpumux.runtime.MAX_STEP == step["maximum"]
    assert runtime_reporter.MAX_METRICS == fields.MAX_METRICS
    assert runtime_reporter.MAX_METRIC_CHARS == fields.MAX_NAME_CHARS
    assert runtime_reporter.MAX_SAMPLES == fields.MAX_SAMPLES
    assert runtime_reporter.MAX_REPORT_SECONDS == fields.MAX_REPORT_SECONDS
    pool = ReportIn.model_json_schema()["properties"]["pool_mb"]["anyOf"][0]
    assert runtime_reporter.MAX_POOL_MB == pool["maximum"]


def test_metrics_are_cut_to_what_a_report_holds_and_the_cut_is_said() -> None:
    many = {f"m{i}": i for i in range(300)}
    bad_names = ["", "x" * 201, "bad\ud800", "nul\x00"]

    assert report_metrics({"loss": 1, "acc": 2}) == ({"loss": 1.0, "acc": 2.0}, None)
    kept, why = report_metrics(many)
    assert list(kept) == [f"m{i}" for i in range(256)]
    assert why == "300 metrics in one report: only the first 256 are sent"
    kept, why = report_metrics({"loss": 1} | dict.fromkeys(bad_names, 2.0))
    assert kept == {"loss": 1.0}
    assert why is not None and "over 200 characters, or holds a NUL or a lone surrogate" in why


def test_a_report_beyond_the_daemons_bounds_is_cut_and_taken(
    api: httpx.Client,
    sessions: Sessions,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with sessions.write.begin() as session:
        trial_id = stored_running_trial(session, tmp_path)
    reporter = Reporter(url=str(api.base_url), token="secret", trial_id=trial_id, attempt=1)
    metrics = {f"m{i}": float(i) for i in range(300)} | {"m" * 201: 1.0, "val_\ud800": 2.0}

    reporter.submit(kind="manual", step=3, samples=1e13, seconds=0.5, metrics=metrics)
    reporter.submit(kind="manual", step=4, samples=-1, seconds=2e7, metrics={"val_loss": 0.5})

    assert reporter.flush(timeout=30)
    assert (reporter.delivered, reporter.dropped) == (2, 0)
    stored = api.get(f"/trials/{trial_id}/reports").json()["data"]
    assert [(r["step"], r["samples"], r["seconds"]) for r in stored] == [
        (3, None, 0.5),
        (4, None, None),
    ]
    assert list(stored[0]["metrics"]) == [f"m{i}" for i in range(256)]
    assert capsys.readouterr().err.splitlines() == [
        "gpumux: WARNING: a metric whose name is empty, over 200 characters, or holds a NUL or a "
        "lone surrogate is not reported; 300 metrics in one report: only the first 256 are sent",
        "gpumux: WARNING: samples must be a finite number from 0 to 1e+12: reports go without them",
    ]


def test_a_refused_report_is_dropped_alone_with_the_daemons_reason(
    api: httpx.Client,
    sessions: Sessions,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with sessions.write.begin() as session:
        trial_id = stored_running_trial(session, tmp_path)
    # Attempt 2 of a trial on its first: the daemon refuses each report of it.
    stale = Reporter(url=str(api.base_url), token="secret", trial_id=trial_id, attempt=2)
    for step in range(3):
        stale.submit(kind="manual", step=step, samples=1, seconds=1, metrics={"val_loss": 1})
    current = Reporter(url=str(api.base_url), token="secret", trial_id=trial_id, attempt=1)
    current.submit(kind="manual", step=0, samples=1, seconds=1, metrics={"val_loss": 1})

    assert stale.flush(timeout=30) and current.flush(timeout=30)
    assert (stale.delivered, stale.dropped) == (0, 3)
    assert (current.delivered, current.dropped) == (1, 0)
    (warning,) = capsys.readouterr().err.splitlines()
    assert warning.startswith("gpumux: WARNING: the gpumux daemon refused a report (HTTP 409")
    assert warning.endswith("); training goes on, reports it refuses are dropped")
    assert "does not answer" not in warning
