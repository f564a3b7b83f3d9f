"""How `gpumux tune` keeps a GPU busy between N without two N ever computing together.

The next N's trials are launched while the current N computes, through a gate
(gpumux.runtime.gate): each starts up (imports, a CUDA context, its allocation), says it is
ready and waits; tune opens the gate as the current N's last trial exits. So the device goes
from one N to the next with no start-up between them, and each N computes alone: its window
from the gate opening to its last trial's end holds that N's trials and no other's.

The next N is launched only once every trial of the current one has passed its own gate: then
the command is known to wait at one (a script that never reaches it runs its rounds one after
another, as on the CPU), and the current N's start-ups are over. For room beside them, a
round's trials are launched under the split of both N together (each holds 1/(N + next N) of
the device: its memory slice and its share of the host's cores); a round that runs out of
memory that way is measured again alone.
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from gpumux.cli.rounds import Round
from gpumux.fields import MAX_SPLIT
from gpumux.runtime.gate import CLOSED, GATE_ENV

OUT_OF_MEMORY = re.compile(r"out of (device )?memory", re.IGNORECASE)


def launch_split(splits: Sequence[int], index: int, *, work_cores: int | None, rounds: int) -> int:
    """The N the round of `splits[index]` is launched under: room beside its trials for those of
    the N before or after it (the larger), so that either may start up while it computes.

    Not where the host's cores do the trials' work (`work_cores`, the device's kind says: the
    CPU's N is the trials' thread count, and start-ups compete for those cores), nor with
    several waves per round (their own trials fill the room), nor past MAX_SPLIT.
    """
    split = splits[index]
    beside = max((splits[i] for i in (index - 1, index + 1) if 0 <= i < len(splits)), default=0)
    if not beside or work_cores is not None or rounds != 1 or split + beside > MAX_SPLIT:
        return split
    return split + beside


class Gate:
    """One round's gate: a directory its trials say they are ready in, closed until opened."""

    def __init__(self, directory: Path, *, closed: bool) -> None:
        directory.mkdir(parents=True)
        self.directory = directory
        self.opened_at: datetime | None = None
        # Held while closed: a tune killed before it opens the gate releases its trials.
        self._lock: int | None = None
        if closed:
            self._lock = os.open(directory / CLOSED, os.O_CREAT | os.O_WRONLY, 0o600)
            fcntl.flock(self._lock, fcntl.LOCK_EX)
        else:
            self.opened_at = datetime.now(UTC)

    @property
    def env(self) -> dict[str, str]:
        """What the round's trials need to find it."""
        return {GATE_ENV: str(self.directory)}

    def open(self) -> None:
        """Let the waiting trials compute (again is harmless)."""
        if self.opened_at is None:
            (self.directory / CLOSED).unlink()
            self.opened_at = datetime.now(UTC)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def ready(self) -> dict[int, datetime]:
        """When each trial (by id) said it was ready."""
        found = {}
        for path in self.directory.iterdir():
            if path.name.isdigit():
                found[int(path.name)] = datetime.fromtimestamp(path.stat().st_mtime, UTC)
        return found

    def held_s(self) -> dict[int, float]:
        """Seconds each trial (by id) waited ready at the closed gate."""
        if self.opened_at is None:
            return {}
        opened = self.opened_at
        return {
            trial: max(0.0, (opened - at).total_seconds()) for trial, at in self.ready().items()
        }


def all_exited(pids: Iterable[int | None]) -> bool:
    """Whether every one of these trial processes has exited (None: not started yet)."""
    for pid in pids:
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            return False
        return False
    return True


def out_of_memory(measured: Round) -> bool:
    """Whether a trial of the round ran out of device memory."""
    return any(OUT_OF_MEMORY.search(error) for error in measured.errors)
