"""A PyTorch MLP that reports to gpumux itself: the pattern for any script that is not Keras.

Trains on CUDA when it is available, else on the CPU. The data (scikit-learn's digits, or generated
with --samples) lives on the device, so a step is kernels and their launches only, which is what
packing several trials onto one GPU changes. Each epoch reports its training samples right after
its timed steps (CUDA synchronised), then its validation metrics at step = the epoch's index (what
a pruner compares), so every training interval that gpumux measures holds training steps only.
Between epochs it asks should_stop(): a pruned or cancelled trial ends there, on its own.

    gpumux sweep lr=1e-4..1e-2 width=256,1024 -- python examples/torch_mlp.py --samples=200000
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
from torch import nn

try:
    from gpumux.runtime import report, should_stop
except ImportError:  # outside gpumux, where gpumux is not installed: nothing to report to

    def report(samples: float | None = None, *, step: int | None = None, **metrics: float) -> None:
        """Stand-in for gpumux.runtime.report where gpumux is not installed."""

    def should_stop() -> bool:
        """Stand-in for gpumux.runtime.should_stop where gpumux is not installed."""
        return False


CLASSES = 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags a sweep sets, as --name=value or --name value."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    parser.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--width", type=int, default=256, help="units in each hidden layer")
    parser.add_argument("--depth", type=int, default=2, help="hidden layers")
    parser.add_argument(
        "--samples", type=int, default=0, help="generated samples (0: scikit-learn's digits)"
    )
    parser.add_argument("--features", type=int, default=64, help="features of generated samples")
    parser.add_argument(
        "--steps-per-epoch",
        "--steps_per_epoch",
        dest="steps_per_epoch",
        type=int,
        default=0,
        help="optimizer steps per epoch (0: one pass over the training data)",
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def load_data(samples: int, features: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Digits when samples is 0, else Gaussian classes that overlap enough to need training."""
    rng = np.random.default_rng(seed)
    if samples == 0:
        from sklearn.datasets import load_digits

        digits = load_digits()
        x, y = digits.data / 16.0, digits.target
    else:
        centres = rng.normal(0.0, 1.0, size=(CLASSES, features))
        y = rng.integers(0, CLASSES, size=samples)
        x = centres[y] + rng.normal(0.0, 2.0, size=(samples, features))
    order = rng.permutation(len(y))
    return x[order].astype("float32"), y[order].astype("int64")


def build_model(features: int, width: int, depth: int) -> nn.Sequential:
    """`depth` hidden ReLU layers of `width` units and a linear head."""
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Linear(features if i == 0 else width, width), nn.ReLU()]
    layers.append(nn.Linear(width if depth else features, CLASSES))
    return nn.Sequential(*layers)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued kernels, so that a clock reading covers them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    steps: int,
) -> tuple[int, float]:
    """Run `steps` optimizer steps; (samples processed, their mean loss)."""
    model.train()
    loss_fn = nn.CrossEntropyLoss()
    order = torch.randperm(len(x), device=x.device)
    total_loss = torch.zeros((), device=x.device)
    seen = 0
    for step in range(steps):
        start = (step * batch_size) % len(x)
        batch = order[start : start + batch_size]
        loss = loss_fn(model(x[batch]), y[batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        # Summed on the device: reading the loss every step would synchronise every step.
        total_loss += loss.detach() * len(batch)
        seen += len(batch)
    return seen, total_loss.item() / max(seen, 1)


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(mean loss, accuracy) on held-out data, in chunks that bound the memory used."""
    model.eval()
    total_loss, correct = 0.0, 0
    for start in range(0, len(x), 8192):
        logits = model(x[start : start + 8192])
        target = y[start : start + 8192]
        total_loss += nn.functional.cross_entropy(logits, target, reduction="sum").item()
        correct += int((logits.argmax(dim=1) == target).sum().item())
    return total_loss / len(x), correct / len(x)


def main(argv: list[str] | None = None) -> None:
    """Train, report each epoch to gpumux, print the final validation metrics."""
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    x, y = load_data(args.samples, args.features, args.seed)
    held_out = len(x) // 5
    x_val, x_train = (torch.from_numpy(part).to(device) for part in (x[:held_out], x[held_out:]))
    y_val, y_train = (torch.from_numpy(part).to(device) for part in (y[:held_out], y[held_out:]))
    model = build_model(x.shape[1], args.width, args.depth).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    steps = args.steps_per_epoch or math.ceil(len(x_train) / args.batch_size)
    print(f"device={device} train={len(x_train)} val={held_out} steps/epoch={steps}", flush=True)

    val_loss = val_accuracy = float("nan")
    synchronize(device)
    report()  # starts the clock: the first epoch's interval then holds its training steps only
    should_stop()  # from here a stop from gpumux waits for the end of the epoch
    for epoch in range(1, args.epochs + 1):
        started = time.perf_counter()
        seen, loss = train_epoch(model, optimizer, x_train, y_train, args.batch_size, steps)
        synchronize(device)
        elapsed = time.perf_counter() - started
        report(samples=seen, loss=loss)
        val_loss, val_accuracy = evaluate(model, x_val, y_val)
        report(step=epoch - 1, val_loss=val_loss, val_accuracy=val_accuracy)
        print(
            f"epoch {epoch}/{args.epochs} loss={loss:.4f} val_loss={val_loss:.4f} "
            f"val_accuracy={val_accuracy:.4f} samples/s={seen / elapsed:.0f}",
            flush=True,
        )
        if should_stop():
            print(f"stopped by gpumux after epoch {epoch}", flush=True)
            break
    print(f"final val_loss={val_loss:.4f} val_accuracy={val_accuracy:.4f}")


if __name__ == "__main__":
    main()
