"""Plausible random models of a simulated GPU, for `benchmarks/split_search.py --random-models`.

A drawn model is a device and a workload a user could meet: a GPU's memory (24 GB to 141 GB),
the host's cores (8 to 32), what each trial holds (its slices fit anywhere from 2 to 60 at once, as
far as the smallest slice allows),
a start-up of 2 to 12 s, and a throughput curve with a knee: near-linear up to the knee (each
trial losing up to 2% per trial added), then flat or slowly falling (up to 1.5% per trial
beyond), the knee log-uniform in 1 to 40. The search must settle well on any of them, not only
on the shipped three files.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

from gpumux.devices.simulated.model import parse_model

MEMORIES_MB = (24_576, 40_960, 81_559, 143_771)
CORES = (8, 16, 32)
# The N at which the drawn curve is given (linear between, as a measured file would be).
GRID = (1, 2, 3, 5, 8, 13, 21, 34, 55)


def draw(rng: random.Random, index: int) -> dict[str, Any]:
    """One model file's content."""
    memory_mb = rng.choice(MEMORIES_MB)
    # The daemon's reserve (512 MiB) and overhead per process (1,024), and its smallest slice
    # (256): no more trials fit than that allows.
    room = memory_mb - 512
    fits = rng.randint(2, min(60, room // (1024 + 256)))
    context_mb = rng.randint(300, 800)
    # What one trial holds for its slices to fit `fits` at once.
    per_process_mb = room // fits - 1024 + context_mb
    knee = max(1, round(math.exp(rng.uniform(0.0, math.log(40)))))
    loss = rng.uniform(0.0, 0.02)
    fall = rng.uniform(0.0, 0.015)
    one = round(10 ** rng.uniform(3, 5))

    def aggregate(n: int) -> float:
        up = min(n, knee)
        rate = one * up * (1 - loss) ** (up - 1)
        return rate * (1 - fall) ** max(0, n - knee)

    grid = sorted(set(GRID) | {knee})
    return {
        "name": f"Random GPU {index}",
        "about": (
            f"drawn by benchmarks/random_models.py: knee at N={knee}, memory fits "
            f"{fits}, each trial {loss:.1%} slower per trial added up to the knee, the device "
            f"{fall:.1%} slower per trial beyond it"
        ),
        "memory_mb": memory_mb,
        "cores": rng.choice(CORES),
        "per_process_mb": per_process_mb,
        "context_mb": context_mb,
        "startup_s": round(rng.uniform(2.0, 12.0), 1),
        # An epoch of 0.5 to 3 s alone: a report line every few seconds at most.
        "epoch_samples": max(1, round(one * rng.uniform(0.5, 3.0))),
        "throughput": {str(n): round(aggregate(n), 1) for n in grid},
    }


def write_models(count: int, seed: int, directory: Path) -> list[Path]:
    """`count` drawn models as files in `directory` (each checked by the simulator's parser)."""
    rng = random.Random(seed)
    paths = []
    for index in range(1, count + 1):
        content = draw(rng, index)
        path = directory / f"random-{seed}-{index}.json"
        text = json.dumps(content, indent=2)
        parse_model(text, source=str(path))
        path.write_text(text + "\n", encoding="utf-8")
        paths.append(path)
    return paths
