"""Trial start-up, run by the bootstrap sitecustomize before the user's script.

It sets JAX's environment and hooks the frameworks; each framework's own set-up waits for the
script to import it, so a trial that never imports TensorFlow pays nothing for it. PyTorch's
hook also counts the script's optimizer steps (torch_steps), its throughput where it reports
no samples.
"""

from __future__ import annotations

import os

from gpumux.runtime import context, frameworks, importhook

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType


def activate() -> None:
    """Prepare this trial process for its slice and its measurement; nothing outside gpumux."""
    trial = context.current()
    if trial is None:
        return
    frameworks.set_jax_environment(trial, os.environ)

    def on_tensorflow(tf: ModuleType) -> None:
        frameworks.cap_tensorflow(tf, trial)

    def on_torch(torch: ModuleType) -> None:
        frameworks.cap_torch(torch, trial)
        frameworks.check_torch_sees_gpu(torch, trial)
        _count_torch_steps(torch)

    importhook.install({"tensorflow": on_tensorflow, "keras": _on_keras, "torch": on_torch})


def _on_keras(keras: ModuleType) -> None:
    # Imported here: inspect and functools cost milliseconds that a trial without Keras keeps.
    from gpumux.runtime import keras_fit

    keras_fit.instrument(keras)


def _count_torch_steps(torch: ModuleType) -> None:
    # Imported here, as Keras's hook is: the reporter's modules cost a trial without PyTorch.
    from gpumux.runtime import torch_steps

    torch_steps.count_steps(torch)
