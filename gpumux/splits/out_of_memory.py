"""Whether a failed trial ran out of device memory, from the last lines of its log."""

from __future__ import annotations

import re

# What TensorFlow, PyTorch, JAX and CUDA print when a process runs out of device memory.
OUT_OF_MEMORY = re.compile(
    r"ResourceExhaustedError|OOM when allocating|CUDA out of memory|out of memory|"
    r"RESOURCE_EXHAUSTED|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation",
)


def is_out_of_memory(log_tail: str) -> bool:
    """Whether a failed trial's last log lines say it ran out of device memory."""
    return OUT_OF_MEMORY.search(log_tail) is not None
