"""What a trial is budgeted beyond its memory cap: the one rule placement and the split search
share (`accounting.Overheads` keeps what was measured per device)."""

from __future__ import annotations


def trial_overhead_mb(*, configured: int, seen: int | None, context: int | None) -> int:
    """What a trial holds beyond its cap: its workload's measured CUDA context (what NVML
    shows beside the pool its framework tells), or what a trial on the device was seen to hold
    beyond its cap where more; without a context, that seen, else the configured. A context is
    one workload's: cuDNN's handles, TensorFlow's or JAX's own may hold more."""
    if context is None:
        return configured if seen is None else seen
    return max(context, seen or 0)
