"""gpumux.runtime's public functions: params(), in_trial(), report(), in and outside gpumux."""

from __future__ import annotations

from pathlib import Path

import numpy as np
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


@pytest.mark.parametrize(
    ("step", "error", "message"),
    [
        (True, TypeError, "takes an int, the epoch or iteration counted from 0, not bool True"),
        (1.0, TypeError, "not float 1.0"),
        ("3", TypeError, "not str '3'"),
        (-1, ValueError, r"report\(step=-1\): the step must be from 0 to 2147483647"),
        (2**31, ValueError, "must be from 0 to 2147483647"),
    ],
)
def test_a_bad_step_is_refused_in_the_script(
    monkeypatch: pytest.MonkeyPatch, step: object, error: type[Exception], message: str
) -> None:
    # Refused outside gpumux too: the script's bug shows before a sweep runs it.
    monkeypatch.delenv("GPUMUX_TRIAL_ID", raising=False)

    with pytest.raises(error, match=message):
        report(step=step, loss=1.0)  # type: ignore[arg-type]


def test_any_integer_type_is_a_step(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[dict[str, object]] = []
    monkeypatch.setenv("GPUMUX_TRIAL_ID", "4")
    monkeypatch.setattr(reporter, "submit", lambda **report: sent.append(report))

    report(step=np.int64(3), loss=1.0)  # type: ignore[arg-type]
    report(step=0)

    assert [(r["step"], type(r["step"])) for r in sent] == [(3, int), (0, int)]
    assert sent[0]["metrics"] == {"loss": 1.0}


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
    assert [(r["kind"], r["step"], r["samples"]) for r in reports] == [
        ("manual", 0, 100.0),
        ("manual", 1, 100.0),
        ("manual", 2, 100.0),
    ]
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
        "gpumux.runtime.keras_fit, gpumux.runtime.stopping; "
        "print(sorted({name.split('.')[0] for name in sys.modules} - set(sys.stdlib_module_names)))"
    )

    # -S: no site-packages at all, so anything beyond the standard library would fail to import.
    result = run_python(["-S", "-c", script, str(REPO_ROOT)], {}, tmp_path)

    assert result.returncode == 0, result.stdout
    assert result.stdout.strip() == "['__main__', 'gpumux']"
