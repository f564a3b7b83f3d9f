"""The trial's side of the trial contract: the GPUMUX_* environment, and gpumux's stderr lines.

Loaded at interpreter start in every trial, so it imports only what Python has loaded already.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


class TrialContext:
    """What the launcher told this trial process through its environment."""

    __slots__ = (
        "trial_id",
        "attempt",
        "url",
        "token",
        "framework_device",
        "memory_limit_mb",
        "device_memory_mb",
        "split",
        "cpu_threads",
    )

    def __init__(
        self,
        *,
        trial_id: int,
        attempt: int,
        url: str | None,
        token: str | None,
        framework_device: str,
        memory_limit_mb: int | None,
        device_memory_mb: int | None,
        split: int | None,
        cpu_threads: int | None,
    ) -> None:
        self.trial_id = trial_id
        self.attempt = attempt
        self.url = url
        self.token = token
        self.framework_device = framework_device
        self.memory_limit_mb = memory_limit_mb
        self.device_memory_mb = device_memory_mb
        self.split = split
        self.cpu_threads = cpu_threads

    @property
    def on_gpu(self) -> bool:
        """Whether the trial's frameworks train on a CUDA GPU it holds a slice of (its device
        kind says so in GPUMUX_FRAMEWORK_DEVICE; a new kind needs nothing here)."""
        return self.framework_device == "cuda"

    @property
    def split_note(self) -> str:
        """' (split N)' for the stderr lines, or '' when the split is unknown."""
        return f" (split {self.split})" if self.split is not None else ""


def say(message: str) -> None:
    """Write one 'gpumux: ...' line to stderr, where the trial's log collects it."""
    stream = sys.stderr
    if stream is not None:
        stream.write(f"gpumux: {message}\n")
        stream.flush()


def current(environ: Mapping[str, str] | None = None) -> TrialContext | None:
    """The trial contract for this process, or None outside gpumux (no GPUMUX_TRIAL_ID)."""
    env = os.environ if environ is None else environ
    trial_id = _int(env, "GPUMUX_TRIAL_ID")
    if trial_id is None:
        return None
    return TrialContext(
        trial_id=trial_id,
        attempt=_int(env, "GPUMUX_ATTEMPT") or 1,
        url=env.get("GPUMUX_URL") or None,
        token=env.get("GPUMUX_TRIAL_TOKEN") or None,
        framework_device=env.get("GPUMUX_FRAMEWORK_DEVICE") or _before_framework_device(env),
        memory_limit_mb=_int(env, "GPUMUX_MEMORY_LIMIT_MB"),
        device_memory_mb=_int(env, "GPUMUX_DEVICE_MEMORY_MB"),
        split=_int(env, "GPUMUX_SPLIT"),
        cpu_threads=_int(env, "GPUMUX_CPU_THREADS"),
    )


def _before_framework_device(env: Mapping[str, str]) -> str:
    # A contract from before GPUMUX_FRAMEWORK_DEVICE (a trial started by an older daemon, whose
    # children start with this runtime): its two kinds, the CPU device's threads or a GPU.
    return "cpu" if env.get("GPUMUX_DEVICE_KIND") == "cpu" else "cuda"


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        # A malformed variable is the launcher's bug; the training itself must still run.
        say(f"WARNING: ignoring {name}={raw!r}: not an integer")
        return None
