"""An unmodified PyTorch loop measured by its optimizer steps, as a real trial of a real daemon."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import httpx
import pytest
from builders import daemon_bearer
from ports import free_port

from gpumux.config import Settings
from gpumux.runtime.torch_steps import REPORT_INTERVAL_S
from gpumux.server.daemon import embedded

from .support import ReportServer, run_python, trial_env

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="PyTorch is not installed here (pip install torch); the fixture needs it",
)


def test_a_torch_loop_that_imports_no_gpumux_gives_steps_per_second(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", url=f"http://127.0.0.1:{free_port()}")
    with (
        embedded(settings) as daemon,
        httpx.Client(
            base_url=daemon.url, timeout=30, headers=daemon_bearer(settings.home)
        ) as client,
    ):
        # Spread over a few report intervals, so that the throttle shows.
        seconds = 3 * REPORT_INTERVAL_S
        created = client.post(
            "/sweeps",
            json={
                "params": ["steps=1500"],
                "command": [
                    sys.executable,
                    str(FIXTURES / "torch_loop.py"),
                    "{steps}",
                    f"{seconds}",
                ],
                "workdir": str(tmp_path),
                "env": dict(os.environ),
                "split": 1,
            },
        ).json()
        deadline = time.monotonic() + 300
        while (sweep := client.get(f"/sweeps/{created['id']}").json())["status"] != "finished":
            assert time.monotonic() < deadline, f"sweep did not finish: {sweep}"
            time.sleep(0.2)
        trials = client.get(f"/sweeps/{created['id']}/trials").json()["data"]
        assert [t["status"] for t in trials] == ["succeeded"], [t["error"] for t in trials]
        for trial in trials:
            log = client.get(f"/trials/{trial['id']}/log", params={"offset": 0}).json()["data"]
            steps = trial["params"]["steps"]
            assert f"steps {steps} " in log, log
            assert trial["steps_per_s"] > 0, trial
            assert trial["samples_per_s"] is None, trial
            reports = client.get(f"/trials/{trial['id']}/reports").json()["data"]
            assert {r["kind"] for r in reports} == {"steps"}, reports
            # Every optimizer step counted once: the throttled reports and the one at exit.
            assert sum(r["steps"] for r in reports) == steps, reports
            # One report per interval at most, not one per step; only the one at exit is early.
            assert len(reports) >= 2, reports
            assert all(r["seconds"] >= REPORT_INTERVAL_S for r in reports[:-1]), reports


def test_a_script_that_reports_samples_sends_no_steps_from_its_first_samples_on(
    report_server: ReportServer, tmp_path: Path
) -> None:
    loop = str(FIXTURES / "torch_loop.py")
    # The fixture's loop, paced over three intervals, reporting samples after each step.
    script = (
        "import runpy, sys\n"
        "from torch.optim.optimizer import register_optimizer_step_post_hook\n"
        "from gpumux.runtime import report\n"
        "register_optimizer_step_post_hook(lambda *_: report(samples=64))\n"
        f"sys.argv = [{loop!r}, '300', '{3 * REPORT_INTERVAL_S}']\n"
        f"runpy.run_path({loop!r}, run_name='__main__')\n"
    )
    result = run_python(["-c", script], trial_env(report_server.url), tmp_path)

    assert result.returncode == 0, result.stdout
    kinds = [r["kind"] for r in report_server.reports]
    # A first step that came an interval after torch's import may still go as steps.
    assert kinds[kinds.index("manual") :] == ["manual"] * 300, kinds
