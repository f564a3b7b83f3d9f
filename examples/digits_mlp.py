"""A numpy MLP on scikit-learn's bundled digits that reports each epoch as a GPUMUX_REPORT line.

It imports nothing from gpumux: the daemon reads the lines it prints. Sweep it with

    gpumux sweep --search tpe --trials 12 --prune asha --objective val_loss:min \\
        lr=1e-4..1e-1 width=16,64,128 -- python examples/digits_mlp.py

The 8x8 digits are blown up to 32x32 and shifted by up to 2 pixels at random (an epoch is
PASSES such passes over the 1,437 training images); two hidden ReLU layers of --width; SGD
with momentum 0.9, the learning rate decayed to zero over the epochs (cosine), the gradient's
norm clipped at 5 so that too large a step bounces on a finite loss rather than overflowing.
On the 2-core machine this was written on, one thread, batch 32: an epoch took about 0.12 s
at width 16, 0.19 s at 64, 0.22 s at 128, plus about 1.5 s to start. Both flags matter within
30 epochs (final val_loss): lr=1e-4 crawls (0.2-0.4), lr=1e-1 bounces (0.4-1.2), 1e-3 gets to
0.06-0.07, 3e-3 to 0.035, 1e-2..3e-2 to 0.02-0.026; the wider, the better at every lr.
"""

from __future__ import annotations

import argparse
import json
import math
import os

# Set before numpy loads its BLAS: a trial packed with others uses only its share of the cores.
if threads := os.environ.get("GPUMUX_CPU_THREADS"):
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = threads

import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

PASSES = 6
SIZE = 32
SHIFT = 2
CLIP_NORM = 5.0
MOMENTUM = 0.9

Array = np.ndarray
Batches = list[tuple[Array, Array]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags a sweep sets, as --name=value or --name value."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=0.01, help="SGD learning rate")
    parser.add_argument("--width", type=int, default=64, help="units in each hidden layer")
    parser.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0, help="initial weights and shuffling")
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.width < 1:
        parser.error("--epochs, --batch-size and --width must be at least 1")
    return args


def split_digits() -> tuple[Array, Array, Array, Array]:
    """Flattened SIZE x SIZE images in [0, 1] and their labels: a training four fifths and a
    held-out fifth, the same for every trial (a fixed seed)."""
    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    x = upsampled((digits.images[order] / 16.0).astype(np.float32))
    y = digits.target[order]
    cut = len(y) * 4 // 5
    return x[:cut], y[:cut], x[cut:], y[cut:]


def upsampled(images: Array) -> Array:
    """8x8 images as SIZE x SIZE ones (each pixel repeated), flattened."""
    scale = SIZE // 8
    big = images.repeat(scale, axis=1).repeat(scale, axis=2)
    return big.reshape(len(images), SIZE * SIZE)


def shifted(images: Array, rng: np.random.Generator) -> Array:
    """Each SIZE x SIZE image moved by up to SHIFT pixels each way (zeros come in at the edge)."""
    side = SIZE + 2 * SHIFT
    padded = np.pad(images.reshape(-1, SIZE, SIZE), ((0, 0), (SHIFT, SHIFT), (SHIFT, SHIFT)))
    dy, dx = rng.integers(0, 2 * SHIFT + 1, size=(2, len(images)))
    start = (np.arange(len(images)) * side + dy) * side + dx
    offsets = (np.arange(SIZE)[:, None] * side + np.arange(SIZE)[None, :]).ravel()
    return padded.reshape(-1)[start[:, None] + offsets[None, :]]


def init(width: int, rng: np.random.Generator) -> list[Array]:
    """He-initialised weights and zero biases of SIZE*SIZE -> width -> width -> 10."""
    sizes = [SIZE * SIZE, width, width, 10]
    params = []
    for fan_in, fan_out in zip(sizes, sizes[1:], strict=False):
        params.append(rng.standard_normal((fan_in, fan_out)) * np.sqrt(2 / fan_in))
        params.append(np.zeros(fan_out))
    return [p.astype(np.float32) for p in params]


def forward(params: list[Array], x: Array) -> tuple[list[Array], Array]:
    """The activations of each layer, and the log-probabilities of the ten classes."""
    activations = [x]
    for k in range(0, len(params) - 2, 2):
        activations.append(np.maximum(activations[-1] @ params[k] + params[k + 1], 0))
    logits = activations[-1] @ params[-2] + params[-1]
    logits -= logits.max(axis=1, keepdims=True)
    return activations, logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))


def gradients(params: list[Array], x: Array, y: Array) -> list[Array]:
    """The mean cross-entropy's gradient with respect to every weight and bias."""
    activations, log_probs = forward(params, x)
    delta = np.exp(log_probs)
    delta[np.arange(len(y)), y] -= 1
    delta /= len(y)
    grads: list[Array] = []
    for k in range(len(params) - 2, -1, -2):
        grads[:0] = [activations[k // 2].T @ delta, delta.sum(axis=0)]
        if k:
            delta = (delta @ params[k].T) * (activations[k // 2] > 0)
    return grads


def evaluate(params: list[Array], x: Array, y: Array) -> tuple[float, float]:
    """Mean cross-entropy and accuracy on (x, y)."""
    _, log_probs = forward(params, x)
    loss = -float(log_probs[np.arange(len(y)), y].mean())
    return loss, float((log_probs.argmax(axis=1) == y).mean())


def train_epoch(params: list[Array], velocity: list[Array], lr: float, data: Batches) -> None:
    """One pass of SGD with momentum over `data`, in place."""
    for x, y in data:
        grads = gradients(params, x, y)
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
        step = lr * min(1.0, CLIP_NORM / (norm + 1e-12))
        for p, v, g in zip(params, velocity, grads, strict=True):
            v *= MOMENTUM
            v -= step * g
            p += v


def batches(images: Array, labels: Array, size: int, rng: np.random.Generator) -> Batches:
    """The PASSES shifted copies of the training set, shuffled, in batches of `size`."""
    x = np.concatenate([shifted(images, rng) for _ in range(PASSES)])
    y = np.tile(labels, PASSES)
    order = rng.permutation(len(y))
    return [(x[order[k : k + size]], y[order[k : k + size]]) for k in range(0, len(y), size)]


def main(argv: list[str] | None = None) -> None:
    """Train, and print one GPUMUX_REPORT line of validation metrics after each epoch."""
    args = parse_args(argv)
    rng = np.random.default_rng(args.seed)
    x_train, y_train, x_val, y_val = split_digits()
    params = init(args.width, rng)
    velocity = [np.zeros_like(p) for p in params]
    for epoch in range(args.epochs):
        # Cosine decay to zero at the end: the last epochs settle rather than bounce.
        lr = args.lr * 0.5 * (1 + math.cos(math.pi * epoch / args.epochs))
        data = batches(x_train, y_train, args.batch_size, rng)
        train_epoch(params, velocity, lr, data)
        val_loss, val_accuracy = evaluate(params, x_val, y_val)
        if not math.isfinite(val_loss):
            raise SystemExit(f"epoch {epoch}: the loss is not finite; lower --lr ({args.lr})")
        report = {
            "step": epoch,
            "val_loss": round(val_loss, 6),
            "val_accuracy": round(val_accuracy, 6),
            "samples": PASSES * len(y_train),
        }
        print("GPUMUX_REPORT " + json.dumps(report), flush=True)
    print(f"final val_loss={val_loss:.4f} val_accuracy={val_accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()
