"""Keras fit() measured with no change to the script; the arithmetic of samples per epoch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpumux.runtime import keras_fit
from gpumux.runtime.keras_fit import epoch_size, leading_dimension, samples_after

from .support import FIXTURES, TOKEN, ReportServer, run_python, samples_by_epoch, trial_env


@pytest.mark.slow
def test_unmodified_keras_script_is_capped_and_measured(
    report_server: ReportServer, tmp_path: Path
) -> None:
    result = run_python([str(FIXTURES / "keras_fit.py")], trial_env(report_server.url), tmp_path)

    assert result.returncode == 0, result.stdout
    lines = result.stdout.splitlines()
    applied = (
        "gpumux: tensorflow: CPU device, 1 intra-op and 1 inter-op thread(s) (split 2), "
        "applied before TensorFlow initialised"
    )
    assert applied in lines, result.stdout
    assert lines.index("script: start") < lines.index(applied) < lines.index("script: first op")
    assert "script: intra-op threads 1" in lines
    assert "script: inter-op threads 1" in lines
    # The process has exited, so its exit flush has delivered everything it sent.
    epochs = [r for r in report_server.reports if r["kind"] == "epoch"]
    # 256 minus the validation quarter.
    assert samples_by_epoch(report_server.reports) == [(0, 192.0), (1, 192.0)]
    for report in epochs:
        assert report["trial_id"] == 7
        assert report["attempt"] == 2
        assert report["seconds"] > 0
        assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= report["metrics"].keys()
    assert {r["authorization"] for r in report_server.requests} == {f"Bearer {TOKEN}"}
    assert {r["path"] for r in report_server.requests} == {"/reports"}


def test_epoch_size_of_arrays_minus_the_validation_split() -> None:
    x = np.zeros((1797, 64))

    assert epoch_size({"x": x, "batch_size": 64, "validation_split": 0.2}) == (64, 1437)
    assert epoch_size({"x": x, "validation_split": 0.2, "validation_data": (x, x)}) == (32, 1797)


def test_epoch_size_unknown_for_datasets() -> None:
    class Dataset:
        def __len__(self) -> int:
            return 45  # batches, not samples: must not be taken for the sample count

    assert epoch_size({"x": Dataset(), "batch_size": None}) == (None, None)


def test_leading_dimension_of_multi_input_arrays() -> None:
    assert leading_dimension([np.zeros((10, 3)), np.zeros((10, 5))]) == 10
    assert leading_dimension({"image": np.zeros((7, 2)), "label": np.zeros(7)}) == 7
    assert leading_dimension(None) is None
    assert leading_dimension(np.float32(1.0)) is None


def test_samples_after_counts_the_short_last_batch() -> None:
    assert samples_after(22, batch_size=64, samples_per_epoch=1437) == 1408
    assert samples_after(23, batch_size=64, samples_per_epoch=1437) == 1437
    assert samples_after(5, batch_size=16, samples_per_epoch=None) == 80
    assert samples_after(5, batch_size=None, samples_per_epoch=None) == 5


def test_callback_reports_each_sample_once_across_heartbeats_and_epoch_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The callback's own logic on a plain base: importing Keras here would load TensorFlow into
    # the test process; the slow test above runs it inside real Keras.
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(keras_fit.reporter, "submit", lambda **report: sent.append(report))
    monkeypatch.setattr(keras_fit, "HEARTBEAT_S", 0.0)
    callback = keras_fit.make_callback_class(object)(batch_size=64, samples_per_epoch=150)

    callback.on_epoch_begin(0)
    callback.on_train_batch_end(0, {"loss": 1.0})
    callback.on_train_batch_end(2, {"loss": 0.8})  # steps_per_execution=2: batch 1 is skipped
    callback.on_epoch_end(0, {"loss": 0.7, "val_loss": 0.9})

    assert [(r["kind"], r["step"], r["samples"], r["metrics"]) for r in sent] == [
        ("batch", None, 64.0, {"loss": 1.0}),
        ("batch", None, 86.0, {"loss": 0.8}),
        ("epoch", 0, 0.0, {"loss": 0.7, "val_loss": 0.9}),
    ]
    assert sum(r["samples"] for r in sent) == 150
    assert all(r["seconds"] >= 0 for r in sent)
