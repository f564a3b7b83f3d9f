"""A Keras MLP on scikit-learn's bundled digits (no download): a sweep target for a laptop.

Run it alone, or sweep it (gpumux measures fit() itself; the script knows nothing of gpumux):

    gpumux sweep lr=1e-3..1e-1 batch_size=16,32,64 width=32,128 -- python examples/digits_keras.py
"""

from __future__ import annotations

import argparse

import keras
import numpy as np
from sklearn.datasets import load_digits


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags a sweep sets, as --name=value or --name value."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate")
    parser.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--width", type=int, default=64, help="units in each hidden layer")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Train, validate on a held-out fifth, print the final validation metrics."""
    args = parse_args(argv)
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
