"""The trial contract, the daemon's side: what a trial attempt is started with, and the
environment that tells the trial who and where it is (gpumux.runtime.context reads it). What it
gets of its device (the device, its cap, its threads, its cores) its device kind decides
(gpumux.devices.kinds); here it is joined to the rest."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumux.runtime.gate import GATE_ENV

BOOTSTRAP_DIR = Path(__file__).resolve().parents[1] / "runtime" / "bootstrap"
# Set per trial by the launcher; a submitter's own values must not leak into a trial.
CONTRACT_PREFIXES = ("GPUMUX_",)
CONTRACT_NAMES = ("CUDA_VISIBLE_DEVICES",)
# Of gpumux's names, those its submitter gives a sweep's trials: gpumux tune's gate (where a
# trial launched ahead of its round waits, gpumux.runtime.gate).
SUBMITTED_NAMES = (GATE_ENV,)


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one attempt of one trial."""

    trial_id: int
    sweep_id: int
    attempt: int
    argv: Sequence[str]
    workdir: str
    base_env: Mapping[str, str]
    params: Mapping[str, Any]
    url: str
    token: str
    log_path: Path
    # The kind's name, for the log's first line (its environment names it too).
    device_kind: str
    split: int
    # What its device kind sets (DeviceKind.trial_setup): CUDA_VISIBLE_DEVICES, GPUMUX_DEVICE_KIND,
    # GPUMUX_FRAMEWORK_DEVICE, the memory cap, the threads.
    device_env: Mapping[str, str]
    # The cores the supervisor pins the trial to; None: not pinned.
    cpu_affinity: Sequence[int] | None = None
    # Start it from the preloading spawner, where the framework is imported (a `--preload` sweep).
    preload: bool = False


def trial_env(spec: LaunchSpec) -> dict[str, str]:
    """The trial's environment: the submitter's, less gpumux's own names, plus the contract."""
    env = {
        name: value
        for name, value in spec.base_env.items()
        if name in SUBMITTED_NAMES
        or (not name.startswith(CONTRACT_PREFIXES) and name not in CONTRACT_NAMES)
    }
    python_path = [str(BOOTSTRAP_DIR)]
    if env.get("PYTHONPATH"):
        python_path.append(env["PYTHONPATH"])
    env.update(
        PYTHONPATH=os.pathsep.join(python_path),
        PYTHONUNBUFFERED="1",
        GPUMUX_TRIAL_ID=str(spec.trial_id),
        GPUMUX_SWEEP_ID=str(spec.sweep_id),
        GPUMUX_ATTEMPT=str(spec.attempt),
        GPUMUX_PARAMS=json.dumps(dict(spec.params)),
        GPUMUX_URL=spec.url,
        GPUMUX_TRIAL_TOKEN=spec.token,
        GPUMUX_SPLIT=str(spec.split),
    )
    env.update(spec.device_env)
    return env
