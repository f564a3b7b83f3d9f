"""When `gpumux tune` starts the next N on a GPU: as the current N's trials near their end, so
that the newcomers' start-up (imports, a CUDA context) overlaps the current N's last computing
instead of leaving the GPU idle between N.

Each N is still measured over its own trials, from the first one's start to the last one's end:
what changes is only that the next N's trials start up while the current N computes. For room
beside them, a round's trials are launched under the split of both N together (each holds
1/(N + next N) of the device: its memory slice and its share of the host's cores); a round that
runs out of memory that way is measured again alone.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpumux.cli.rounds import Round
from gpumux.fields import MAX_SPLIT
from gpumux.schemas import TrialPublic
from gpumux.status import TrialStatus

OUT_OF_MEMORY = re.compile(r"out of (device )?memory", re.IGNORECASE)


@dataclass(frozen=True)
class Pace:
    """What the rounds so far say of one trial: the steps it reports, the seconds it starts, and
    the seconds between two launches of the daemon."""

    steps: int
    startup_s: float
    launch_s: float = 0.0

    def lead_s(self, trials: int) -> float:
        """How long before the current N's end the next N's `trials` should be launched: for
        the middle one of them to begin computing as it ends."""
        return self.startup_s + self.launch_s * trials / 2


def pace_of(rounds: Sequence[Round]) -> Pace | None:
    """The latest measured round's pace; None before a round whose trials reported steps."""
    for measured in reversed(rounds):
        if measured.steps and measured.startup_s is not None:
            return Pace(
                steps=measured.steps, startup_s=measured.startup_s, launch_s=measured.launch_s
            )
    return None


def launch_split(splits: Sequence[int], index: int, *, kind: str, rounds: int) -> int:
    """The N the round of `splits[index]` is launched under: room beside its trials for those of
    the N before or after it (the larger), so that either may start up while it computes.

    Not on the CPU (its N is the trials' thread count, and start-ups compete for its cores),
    nor with several waves per round (their own trials fill the room), nor past MAX_SPLIT.
    """
    split = splits[index]
    beside = max((splits[i] for i in (index - 1, index + 1) if 0 <= i < len(splits)), default=0)
    if not beside or kind != "gpu" or rounds != 1 or split + beside > MAX_SPLIT:
        return split
    return split + beside


def expected_end(trial: TrialPublic, pace: Pace) -> datetime | None:
    """When a computing trial should end, at the pace of its reports so far; None: not yet
    known (not started, no report, or one too early to tell its pace)."""
    if trial.started_at is None or trial.step is None or trial.last_report_at is None:
        return None
    computing_since = trial.started_at + timedelta(seconds=pace.startup_s)
    done = trial.step + 1
    per_step = (trial.last_report_at - computing_since) / done
    if per_step <= timedelta(0):
        return None
    return trial.last_report_at + per_step * max(0, pace.steps - done)


def next_is_due(
    trials: Sequence[TrialPublic], pace: Pace, now: datetime, *, newcomers: int = 1
) -> bool:
    """Whether the next N's `newcomers` should start now: each trial of this N has ended or
    reported, and the last is expected to end within their lead (Pace.lead_s; the next N's
    start-up is no shorter: more trials share the host's cores), so that they begin computing
    as it ends."""
    ends = []
    for trial in trials:
        if trial.ended_at is not None:
            continue
        if trial.status not in (TrialStatus.running,):
            return False
        end = expected_end(trial, pace)
        if end is None:
            return False
        ends.append(end)
    return not ends or (max(ends) - now).total_seconds() <= pace.lead_s(newcomers)


def out_of_memory(measured: Round) -> bool:
    """Whether a trial of the round ran out of device memory."""
    return any(OUT_OF_MEMORY.search(error) for error in measured.errors)
