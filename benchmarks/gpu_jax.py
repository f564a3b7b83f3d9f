"""A trial of benchmarks/gpu.py's JAX step: JAX must see the GPU and compute within its slice."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

devices = jax.devices()
print(f"jax {jax.__version__}: {devices}", flush=True)
print(f"XLA_PYTHON_CLIENT_MEM_FRACTION={os.environ.get('XLA_PYTHON_CLIENT_MEM_FRACTION')}")
if devices[0].platform != "gpu":
    raise SystemExit("JAX sees no GPU")
x = jnp.ones((4096, 4096))
print(f"sum {float((x @ x).sum()):.0f}", flush=True)
