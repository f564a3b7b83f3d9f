"""A small Keras CNN on CIFAR-sized generated images (32x32x3, 10 classes, no download).

The heavier example: convolutions make each sample cost far more than in digits_keras.py. The data
is deterministic for a seed and learnable: each class is a smooth colour pattern, each image one
of them with its own contrast, shift, flip and noise.

    gpumux sweep lr=1e-4..1e-2 batch_size=32,64,128 -- python examples/cifar_cnn.py --epochs=5
"""

from __future__ import annotations

import argparse

import keras
import numpy as np

IMAGE_SIZE = 32
CLASSES = 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags a sweep sets, as --name=value or --name value."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    parser.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--width", type=int, default=32, help="filters of the first conv layer")
    parser.add_argument("--samples", type=int, default=8000, help="generated images, 20%% held out")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def make_images(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`samples` images with their labels, the same for the same seed."""
    rng = np.random.default_rng(seed)
    # One smooth pattern per class: 4x4 random colours blown up to 32x32.
    coarse = rng.uniform(-1.0, 1.0, size=(CLASSES, 4, 4, 3))
    patterns = coarse.repeat(IMAGE_SIZE // 4, axis=1).repeat(IMAGE_SIZE // 4, axis=2)
    labels = rng.integers(0, CLASSES, size=samples)
    contrast = rng.uniform(0.5, 1.5, size=(samples, 1, 1, 1))
    images = patterns[labels] * contrast
    shifts = rng.integers(-3, 4, size=(samples, 2))
    for i, (dy, dx) in enumerate(shifts):
        images[i] = np.roll(images[i], (dy, dx), axis=(0, 1))
    flips = rng.random(samples) < 0.5
    images[flips] = images[flips, :, ::-1]
    images += rng.normal(0.0, 1.5, size=images.shape)
    return images.astype("float32"), labels.astype("int32")


def build_model(width: int, lr: float) -> keras.Model:
    """Two conv blocks and a dense head, compiled with Adam."""
    model = keras.Sequential(
        [
            keras.Input(shape=(IMAGE_SIZE, IMAGE_SIZE, 3)),
            keras.layers.Conv2D(width, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(2 * width, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(2 * width, 3, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(2 * width, activation="relu"),
            keras.layers.Dense(CLASSES, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=lr),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def main(argv: list[str] | None = None) -> None:
    """Train, validate on a held-out fifth, print the final validation metrics."""
    args = parse_args(argv)
    keras.utils.set_random_seed(args.seed)
    x, y = make_images(args.samples, args.seed)
    model = build_model(args.width, args.lr)
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
