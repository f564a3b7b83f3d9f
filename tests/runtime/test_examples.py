"""The examples run as gpumux trials (CPU device, one thread) and report what a sweep needs."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from .support import (
    EXAMPLES,
    TIMEOUT_S,
    ReportServer,
    gpumux_lines,
    run_python,
    samples_by_epoch,
    trial_env,
)


@pytest.mark.slow
def test_digits_keras_is_measured_without_knowing_gpumux(
    report_server: ReportServer, tmp_path: Path
) -> None:
    args = [str(EXAMPLES / "digits_keras.py"), "--epochs=2", "--batch-size=64", "--lr=0.01"]

    result = run_python(args, trial_env(report_server.url), tmp_path)

    assert result.returncode == 0, result.stdout
    assert result.stdout.splitlines()[-1].startswith("final val_loss=")
    epochs = [r for r in report_server.reports if r["kind"] == "epoch"]
    assert samples_by_epoch(report_server.reports) == [(0, 1437.0), (1, 1437.0)]
    assert epochs[-1]["metrics"]["val_accuracy"] > 0.5


@pytest.mark.slow
def test_cifar_cnn_is_measured(report_server: ReportServer, tmp_path: Path) -> None:
    args = [str(EXAMPLES / "cifar_cnn.py"), "--samples=320", "--epochs=1", "--width=8"]

    result = run_python(args, trial_env(report_server.url), tmp_path)

    assert result.returncode == 0, result.stdout
    epochs = [r for r in report_server.reports if r["kind"] == "epoch"]
    assert samples_by_epoch(report_server.reports) == [(0, 256.0)]
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= epochs[0]["metrics"].keys()


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="PyTorch is not installed here (pip install torch); torch_mlp.py needs it",
)
def test_torch_mlp_reports_training_then_validation(
    report_server: ReportServer, tmp_path: Path
) -> None:
    args = [str(EXAMPLES / "torch_mlp.py"), "--epochs=2", "--width=32", "--batch_size=64"]

    result = run_python(args, trial_env(report_server.url), tmp_path)

    assert result.returncode == 0, result.stdout
    assert "gpumux: torch: CPU device, 1 thread(s) (split 2)" in result.stdout
    # The runtime counts optimizer steps until the script's first samples, which then win.
    kinds = [r["kind"] for r in report_server.reports]
    first_samples = next(i for i, r in enumerate(report_server.reports) if r["samples"])
    assert "steps" not in kinds[first_samples:], kinds
    reports = [r for r in report_server.reports if r["kind"] != "steps"]
    assert [(r["kind"], r["step"], r["samples"], sorted(r["metrics"])) for r in reports] == [
        ("manual", None, None, []),
        ("manual", None, 1438.0, ["loss"]),
        ("manual", 0, None, ["val_accuracy", "val_loss"]),
        ("manual", None, 1438.0, ["loss"]),
        ("manual", 1, None, ["val_accuracy", "val_loss"]),
    ]
    assert all(r["seconds"] > 0 for r in reports)


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="PyTorch is not installed here (pip install torch); torch_mlp.py needs it",
)
def test_torch_mlp_stopped_by_gpumux_ends_after_its_epoch(
    report_server: ReportServer, tmp_path: Path
) -> None:
    args = [str(EXAMPLES / "torch_mlp.py"), "--epochs=1000", "--width=32", "--batch_size=64"]
    trial = subprocess.Popen(
        [sys.executable, *args],
        env=trial_env(report_server.url),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + TIMEOUT_S
    while not any(r["step"] is not None for r in report_server.reports):
        assert trial.poll() is None, "the trial ended before it was stopped"
        assert time.monotonic() < deadline, "no epoch reported"
        time.sleep(0.05)

    trial.send_signal(signal.SIGTERM)  # as gpumux's supervisor stops a trial
    output, _ = trial.communicate(timeout=TIMEOUT_S)

    assert trial.returncode == 0, output
    epoch = output.splitlines()[-2].removeprefix("stopped by gpumux after epoch ")
    assert 1 <= int(epoch) < 1000, output
    assert output.splitlines()[-1].startswith("final val_loss=")


def test_noop_trial_runs_and_says_nothing(report_server: ReportServer, tmp_path: Path) -> None:
    result = run_python([str(EXAMPLES / "noop.py")], trial_env(report_server.url), tmp_path)

    assert result.returncode == 0
    assert gpumux_lines(result.stdout) == []
    assert result.stdout == ""
    assert report_server.requests == []


def _digits_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("digits_keras", EXAMPLES / "digits_keras.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_digits_keras_keeps_kerass_default_off_a_gpu_host_or_when_told(tmp_path: Path) -> None:
    digits = _digits_module()
    environ: dict[str, str] = {}
    assert digits.choose_keras_backend(environ, tmp_path / "no-driver") is None
    told = {"KERAS_BACKEND": "jax"}
    assert digits.choose_keras_backend(told, tmp_path) is None
    assert environ == {} and told == {"KERAS_BACKEND": "jax"}


def test_digits_keras_runs_keras_on_a_pytorch_that_sees_the_gpu_where_tensorflow_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    digits = _digits_module()
    if not digits._installed("tensorflow-cpu") or digits._installed("tensorflow"):
        pytest.skip("needs TensorFlow's CPU build alone, as gpumux's .[tf] installs it")
    # No GPU here: a PyTorch whose CUDA sees one stands in for a GPU host's.
    torch = ModuleType("torch")
    torch.__spec__ = importlib.machinery.ModuleSpec("torch", None)
    torch.cuda = SimpleNamespace(is_available=lambda: True)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    home = {"KERAS_HOME": str(tmp_path)}
    environ = dict(home)

    assert digits.choose_keras_backend(environ, tmp_path) == "torch"
    assert environ == {**home, "KERAS_BACKEND": "torch"}

    # Keras's own default in keras.json (it writes one at its first import) is no choice;
    # another backend there is the user's.
    (tmp_path / "keras.json").write_text('{"backend": "tensorflow", "floatx": "float32"}')
    assert digits.choose_keras_backend(dict(home), tmp_path) == "torch"
    (tmp_path / "keras.json").write_text('{"backend": "jax"}')
    assert digits.choose_keras_backend(dict(home), tmp_path) is None
    (tmp_path / "keras.json").unlink()

    torch.cuda = SimpleNamespace(is_available=lambda: False)  # type: ignore[attr-defined]
    assert digits.choose_keras_backend(dict(home), tmp_path) is None
