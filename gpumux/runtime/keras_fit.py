"""Measure every Keras `Model.fit` of an unmodified script: samples/s and epoch metrics.

Throughput is timed from callback events (epoch begin and end, batch end), never from when fit()
returns: fit() has been seen returning 6-35 s after its last batch. Each epoch's end is reported
at step = the epoch's index (from 0, as Keras passes it); heartbeats carry no step, as their
metrics cover part of an epoch and must not stand for it.
"""

from __future__ import annotations

import functools
import inspect
import math
import threading
import time

from gpumux.runtime import frameworks, gate, reporter

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import ModuleType
    from typing import Any

HEARTBEAT_S = 2.0
KERAS_DEFAULT_BATCH_SIZE = 32


def instrument(keras: ModuleType) -> None:
    """Wrap keras.Model.fit so that each fit() gets a callback reporting to gpumux."""
    model_class = keras.Model
    original = model_class.fit
    if getattr(original, "__gpumux_original__", None) is not None:
        return
    callback_class = make_callback_class(keras.callbacks.Callback)
    signature = inspect.signature(original)

    @functools.wraps(original)
    def fit(*args: Any, **kwargs: Any) -> Any:
        frameworks.training_with(backend_of(keras))
        # Launched ahead by gpumux tune, it waits here for the round before to end.
        gate.wait_for_turn()
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            # Let Keras word the error about its own arguments.
            return original(*args, **kwargs)
        arguments = bound.arguments
        callbacks = arguments.get("callbacks")
        if callbacks is None or isinstance(callbacks, list | tuple):
            if not any(isinstance(c, callback_class) for c in callbacks or ()):
                batch_size, samples = epoch_size(arguments)
                callback = callback_class(batch_size=batch_size, samples_per_epoch=samples)
                arguments["callbacks"] = [*(callbacks or ()), callback]
        return original(*bound.args, **bound.kwargs)

    fit.__gpumux_original__ = original  # type: ignore[attr-defined]
    model_class.fit = fit


def backend_of(keras: ModuleType) -> str:
    """The framework Keras computes with: Keras 3's backend, TensorFlow for tf.keras."""
    backend = getattr(getattr(keras, "backend", None), "backend", None)
    name = backend() if callable(backend) else None
    return name if isinstance(name, str) else "tensorflow"


def epoch_size(arguments: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(batch size, training samples per epoch) from fit()'s arguments, each None when unknown."""
    samples = leading_dimension(arguments.get("x"))
    batch_size = arguments.get("batch_size")
    if samples is None:
        # Datasets and generators batch themselves: Keras refuses a batch_size with them.
        return (int(batch_size) if batch_size else None), None
    split = arguments.get("validation_split") or 0.0
    if split and arguments.get("validation_data") is None:
        # The arithmetic of keras' train_validation_split.
        samples = int(math.floor(samples * (1.0 - split)))
    return int(batch_size or KERAS_DEFAULT_BATCH_SIZE), samples


def leading_dimension(x: object) -> int | None:
    """Samples in array-like input (an array, or a list/dict of them); None for anything else."""
    while isinstance(x, list | tuple | dict) and x:
        x = next(iter(x.values())) if isinstance(x, dict) else x[0]
    shape = getattr(x, "shape", None)
    try:
        return int(shape[0])  # type: ignore[index]
    except (TypeError, IndexError, ValueError):
        return None


def make_callback_class(base: type) -> type:
    """The GpumuxCallback class, built on this Keras's Callback once Keras is imported."""

    class GpumuxCallback(base):
        """Reports a heartbeat every few seconds and each epoch's end with its metrics."""

        # Keras may call batch hooks from a thread pool (JAX, torch backends); the lock serialises
        # them and the counts use the batch index, so the order of the calls does not matter.
        async_safe = True

        def __init__(self, *, batch_size: int | None, samples_per_epoch: int | None) -> None:
            super().__init__()
            self.batch_size = batch_size
            self.samples_per_epoch = samples_per_epoch
            self._lock = threading.Lock()
            self._mark = time.monotonic()
            self._batches = 0
            self._reported = 0.0

        def samples_done(self) -> float:
            """Samples processed so far in this epoch."""
            return samples_after(
                self._batches, batch_size=self.batch_size, samples_per_epoch=self.samples_per_epoch
            )

        def on_epoch_begin(self, epoch: int, logs: Mapping[str, object] | None = None) -> None:
            with self._lock:
                self._mark = time.monotonic()
                self._batches = 0
                self._reported = 0.0

        def on_train_batch_end(self, batch: int, logs: Mapping[str, object] | None = None) -> None:
            with self._lock:
                now = time.monotonic()
                self._batches = max(self._batches, batch + 1)
                if now - self._mark < HEARTBEAT_S:
                    return
                done = self.samples_done()
                samples, seconds = done - self._reported, now - self._mark
                self._mark, self._reported = now, done
            reporter.submit(
                kind="batch", step=None, samples=samples, seconds=seconds, metrics=logs or {}
            )

        def on_epoch_end(self, epoch: int, logs: Mapping[str, object] | None = None) -> None:
            # Like every report, the samples since the previous one: heartbeats already carried
            # the rest of the epoch, so summing a trial's reports counts each sample once.
            with self._lock:
                now = time.monotonic()
                done = self.samples_done()
                samples, seconds = done - self._reported, now - self._mark
                self._mark, self._reported = now, done
            reporter.submit(
                kind="epoch", step=epoch, samples=samples, seconds=seconds, metrics=logs or {}
            )

    return GpumuxCallback


def samples_after(batches: int, *, batch_size: int | None, samples_per_epoch: int | None) -> float:
    """Samples processed by the first `batches` batches of an epoch (batches when size unknown)."""
    if batch_size is None:
        return float(batches)
    done = batches * batch_size
    return float(done if samples_per_epoch is None else min(done, samples_per_epoch))
