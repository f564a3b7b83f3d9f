"""gpumux.runtime's public functions: params(), in_trial(), report(), in and outside gpumux."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumux.runtime import in_trial, params, report, reporter

from .support import FIXTURES, REPO_ROOT, ReportServer, run_python, trial_env


def test_outside_gpumux_params_are_empty_and_report_does_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GPUMUX_TRIAL_ID", raising=False)
    monkeypatch.setenv("GPUMUX_PARAMS", '{"lr": 0.1}')
    monkeypatch.setattr(reporter, "_reporter", None)

    assert not in_trial()
    assert params() == {}
    report(samples=10, loss=1.0)
    assert reporter.current() is None


def test_params_in_a_trial(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUMUX_TRIAL_ID", "4")
    monkeypatch.setenv("GPUMUX_PARAMS", '{"lr": 0.1, "opt": "adam", "layers": 3}')

    assert in_trial()
    assert params() == {"lr": 0.1, "opt": "adam", "layers": 3}
    monkeypatch.setenv("GPUMUX_PARAMS", "[1, 2]")
    with pytest.raises(ValueError, match="not a JSON object"):
        params()


def test_reports_from_a_script_arrive_with_measured_intervals(
    report_server: ReportServer, tmp_path: Path
) -> None:
    result = run_python([str(FIXTURES / "report_some.py")], trial_env(report_server.url), tmp_path)

    assert result.returncode == 0, result.stdout
    assert "script: params {'lr': 0.01}" in result.stdout
    reports = report_server.reports  # the process has exited: its exit flush is done
    assert [(r["kind"], r["epoch"], r["samples"]) for r in reports] == [("manual", None, 100.0)] * 3
    assert [r["metrics"] for r in reports] == [{"loss": 1.0}, {"loss": 0.5}, {"loss": 1 / 3}]
    assert all(r["seconds"] > 0 for r in reports)
    assert {(r["trial_id"], r["attempt"]) for r in reports} == {(7, 2)}


def test_outside_gpumux_a_script_reports_nothing(
    report_server: ReportServer, tmp_path: Path
) -> None:
    env = trial_env(report_server.url, GPUMUX_TRIAL_ID=None)

    result = run_python([str(FIXTURES / "report_some.py")], env, tmp_path)

    assert result.returncode == 0, result.stdout
    assert "script: params {}" in result.stdout
    assert report_server.requests == []


def test_runtime_loads_with_the_standard_library_only(tmp_path: Path) -> None:
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "import gpumux.runtime, gpumux.runtime.activate, gpumux.runtime.reporter, "
        "gpumux.runtime.keras_fit; "
        "print(sorted({name.split('.')[0] for name in sys.modules} - set(sys.stdlib_module_names)))"
    )

    # -S: no site-packages at all, so anything beyond the standard library would fail to import.
    result = run_python(["-S", "-c", script, str(REPO_ROOT)], {}, tmp_path)

    assert result.returncode == 0, result.stdout
    assert result.stdout.strip() == "['__main__', 'gpumux']"
