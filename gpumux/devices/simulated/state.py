"""A simulated GPU's shared state: its model, its time scale and the trial processes on it.

One directory per simulated device, `<temp dir>/gpumux-simulated-<its UUID>`, so that a trial
finds its device from `CUDA_VISIBLE_DEVICES` alone, as a real one does. It holds `device.json`
(the model and the time scale, written by the daemon's probe) and one empty file per trial
process on the device, named `<pid>-<phase>-<MiB>` (phase `starting` or `computing`, MiB what
NVML shows it holding) and renamed as the trial moves on. A trial lists the directory at each
step to learn how many trials compute beside it; the probe lists it to answer NVML's queries.
An entry whose process is gone (killed with SIGKILL) is skipped by readers and removed by the
probe. The directory is its creator's (0700): simulated trials run as the daemon's user.

Standard library only: the simulated trial imports it.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpumux.devices.simulated.model import DeviceModel, ModelError, model_from, parse_model

DEVICE_FILE = "device.json"
STARTING = "starting"
COMPUTING = "computing"
PHASES = (STARTING, COMPUTING)
MODELS_DIR = Path(__file__).resolve().parent / "models"


def shipped_models() -> list[str]:
    """The names of the model files gpumux ships (`h200-torch-mlp`, ...)."""
    return sorted(path.stem for path in MODELS_DIR.glob("*.json"))


def model_path(value: str | os.PathLike[str]) -> Path:
    """A model file's path, or the shipped model of that name; ModelError when neither."""
    path = Path(value)
    if path.is_file():
        return path
    shipped = MODELS_DIR / f"{value}.json"
    if os.sep not in str(value) and shipped.is_file():
        return shipped
    raise ModelError(
        f"{value}: no such model file, nor a shipped model ({', '.join(shipped_models())})"
    )


def load_model(value: str | os.PathLike[str]) -> DeviceModel:
    """The model of a model file, or of a shipped model by name; ModelError when unusable."""
    path = model_path(value)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ModelError(f"{path}: cannot be read: {error}") from None
    return parse_model(text, source=str(path))


def device_dir(uuid: str) -> str:
    """Where the simulated GPU of this UUID keeps its state."""
    return os.path.join(tempfile.gettempdir(), f"gpumux-simulated-{uuid}")


@dataclass(frozen=True)
class Device:
    """What a simulated device's `device.json` holds."""

    model: DeviceModel
    # Real seconds per simulated second: 0.25 runs everything four times faster.
    time_scale: float


def write_device(directory: str, device: Device) -> None:
    """Create the device's directory if need be and (re)write its `device.json` atomically."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, DEVICE_FILE)
    temporary = f"{path}.{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as out:
        json.dump({"model": device.model.as_json(), "time_scale": device.time_scale}, out)
    os.replace(temporary, path)


def read_device(directory: str) -> Device:
    """The device a directory describes; ModelError when it has none or a damaged one."""
    path = os.path.join(directory, DEVICE_FILE)
    try:
        with open(path, encoding="utf-8") as source:
            data = json.load(source)
    except (OSError, ValueError) as error:
        raise ModelError(f"{path}: no simulated device here: {error}") from None
    scale = data.get("time_scale") if isinstance(data, dict) else None
    if not isinstance(scale, int | float) or isinstance(scale, bool) or not scale > 0:
        raise ModelError(f"{path}: time_scale must be a number above 0, got {scale!r}")
    return Device(model=model_from(data.get("model"), source=path), time_scale=float(scale))


@dataclass(frozen=True)
class Census:
    """The live trial processes on a device: how many start, how many compute, what each holds."""

    starting: int
    computing: int
    # (pid, MiB) of each live process, in no particular order.
    memory: tuple[tuple[int, int], ...]

    @property
    def active(self) -> int:
        """Processes that want a core: starting or computing."""
        return self.starting + self.computing


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _parse(name: str) -> tuple[int, str, int] | None:
    parts = name.split("-")
    if len(parts) != 3 or parts[1] not in PHASES or not parts[0].isdigit():
        return None
    if not parts[2].isdigit():
        return None
    return int(parts[0]), parts[1], int(parts[2])


def census(directory: str, *, remove_dead: bool = False) -> Census:
    """Who is on the device now; `remove_dead` also deletes the entries of dead processes."""
    starting = computing = 0
    memory = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        names = []
    for name in names:
        parsed = _parse(name)
        if parsed is None:
            continue
        pid, phase, mb = parsed
        if not _alive(pid):
            if remove_dead:
                _unlink(os.path.join(directory, name))
            continue
        if phase == STARTING:
            starting += 1
        else:
            computing += 1
        memory.append((pid, mb))
    return Census(starting=starting, computing=computing, memory=tuple(memory))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class Entry:
    """One trial process's entry on its device: created, renamed as it moves on, removed."""

    def __init__(self, directory: str, pid: int) -> None:
        self._directory = directory
        self._pid = pid
        self._path: str | None = None

    def _name(self, phase: str, memory_mb: int) -> str:
        return os.path.join(self._directory, f"{self._pid}-{phase}-{memory_mb}")

    def enter(self, phase: str, memory_mb: int) -> None:
        """Appear on the device (OSError when its directory cannot be written)."""
        path = self._name(phase, memory_mb)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        self._path = path

    def move(self, phase: str, memory_mb: int) -> None:
        """Change phase and memory in one rename: no reader sees the process twice or never."""
        assert self._path is not None, "enter() first"
        path = self._name(phase, memory_mb)
        os.rename(self._path, path)
        self._path = path

    def leave(self) -> None:
        """Disappear from the device (again is harmless)."""
        if self._path is not None:
            _unlink(self._path)
            self._path = None


def remove_if_idle(directory: str) -> bool:
    """Remove a device's directory when no live process is on it; whether it was removed."""
    if census(directory, remove_dead=True).memory:
        return False
    _unlink(os.path.join(directory, DEVICE_FILE))
    try:
        os.rmdir(directory)
    except OSError:
        return False
    return True
