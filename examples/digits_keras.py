"""A Keras MLP on scikit-learn's bundled digits (no download): a sweep target for a laptop.

Run it alone, or sweep it (gpumux measures fit() itself; the script knows nothing of gpumux):

    gpumux sweep lr=1e-3..1e-1 batch_size=16,32,64 width=32,128 -- python examples/digits_keras.py

On an NVIDIA GPU host where TensorFlow is its CPU build (what gpumux's `.[tf]` installs on x86_64)
and a PyTorch that sees the GPU is installed, Keras runs on PyTorch, which uses the GPU;
KERAS_BACKEND, or a backend other than Keras's default in keras.json, decides instead.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
from collections.abc import MutableMapping
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

# Where the NVIDIA driver says it is loaded: a GPU host, found without initialising CUDA.
NVIDIA_DRIVER = Path("/proc/driver/nvidia")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags a sweep sets, as --name=value or --name value."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate")
    parser.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--width", type=int, default=64, help="units in each hidden layer")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _keras_config(environ: MutableMapping[str, str]) -> dict[str, object]:
    """The user's keras.json ($KERAS_HOME, else ~/.keras), where Keras reads its backend."""
    home = Path(environ.get("KERAS_HOME") or Path.home() / ".keras")
    try:
        config = json.loads((home / "keras.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def choose_keras_backend(
    environ: MutableMapping[str, str], nvidia_driver: Path = NVIDIA_DRIVER
) -> str | None:
    """Set KERAS_BACKEND=torch where only PyTorch can use this host's GPU: the driver is loaded,
    TensorFlow is its CPU build alone, and PyTorch sees a GPU. None: Keras's default stays."""
    if "KERAS_BACKEND" in environ or not nvidia_driver.exists():
        return None
    if _keras_config(environ).get("backend", "tensorflow") != "tensorflow":
        # Chosen by the user: Keras writes "tensorflow" there itself on its first import.
        return None
    if not _installed("tensorflow-cpu") or _installed("tensorflow"):
        return None
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    environ["KERAS_BACKEND"] = "torch"
    return "torch"


def main(argv: list[str] | None = None) -> None:
    """Train, validate on a held-out fifth, print the final validation metrics."""
    args = parse_args(argv)
    backend = choose_keras_backend(os.environ)
    if backend is not None:
        print(f"TensorFlow here is its CPU build: Keras runs on {backend}, which sees the GPU")
    # Imported once the backend is chosen: Keras reads KERAS_BACKEND when it is imported.
    import keras

    keras.utils.set_random_seed(args.seed)
    digits = load_digits()
    order = np.random.default_rng(args.seed).permutation(len(digits.target))
    x = (digits.data[order] / 16.0).astype("float32")
    y = digits.target[order].astype("int32")

    model = keras.Sequential(
        [
            keras.Input(shape=(x.shape[1],)),
            keras.layers.Dense(args.width, activation="relu"),
            keras.layers.Dense(args.width, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=args.lr),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    history = model.fit(
        x,
        y,
        batch_size=args.batch_size,
        epochs=args.epochs,
        validation_split=0.2,
        verbose=2,
    )
    final = {name: values[-1] for name, values in history.history.items()}
    print(f"final val_loss={final['val_loss']:.4f} val_accuracy={final['val_accuracy']:.4f}")


if __name__ == "__main__":
    main()
