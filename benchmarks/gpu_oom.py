"""A trial of benchmarks/gpu.py's out-of-memory sweep: 1/D of the GPU, then 4 s of work.

usage: gpu_oom.py D. More than D - 1 at once run out of their slices: PyTorch raises its
out-of-memory error, which gpumux must recognise, requeue and answer with a smaller N.
"""

from __future__ import annotations

import sys
import time

import torch

total = torch.cuda.get_device_properties(0).total_memory
block = torch.empty(total // int(sys.argv[1]), dtype=torch.uint8, device="cuda")
x = torch.randn(2048, 2048, device="cuda")
end = time.monotonic() + 4
while time.monotonic() < end:
    x = torch.tanh(x @ x)
torch.cuda.synchronize()
print(f"held {block.numel() / 2**20:.0f} MiB", flush=True)
