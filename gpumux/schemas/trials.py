"""A trial as answered, and a piece of its log."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpumux.schemas.common import NoGpuFramework
from gpumux.status import TrialStatus


class TrialPublic(BaseModel):
    """One trial: its parameters, where it ran and how it ended."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    sweep_id: int
    number: int
    params: dict[str, Any]
    status: TrialStatus
    attempt: int
    failures: int = Field(default=0, description="reruns spent on the command failing")
    device: str | None
    slot: int | None
    split: int | None
    memory_limit_mb: int | None
    cpu_threads: int | None
    pid: int | None
    queued_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    exit_code: int | None
    signal: int | None
    error: str | None
    objective: float | None
    samples_per_s: float | None
    steps_per_s: float | None = Field(
        default=None,
        description="optimizer steps/s the runtime counted, for a script that reports no samples",
    )
    last_report_at: datetime | None
    step: int | None = Field(
        default=None, description="the last step (epoch or iteration) the trial reported"
    )
    reports_dropped: int = Field(
        default=0,
        description="reports over the trial's budget (GPUMUX_REPORT_RATE, _BURST, _ROWS), not "
        "stored; their samples still count",
    )
    no_gpu: NoGpuFramework | None = Field(
        default=None,
        description="the framework that saw no GPU on the GPU gpumux placed the trial on (a "
        "CPU-only build): the trial trained on the CPU, and the split search left it out",
    )


class TrialsPublic(BaseModel):
    data: list[TrialPublic]
    count: int


class LogChunk(BaseModel):
    """A piece of a trial's log; ask again from `next_offset` to follow it."""

    trial_id: int
    attempt: int
    offset: int
    next_offset: int
    size: int
    skipped: int = Field(
        default=0,
        description="bytes after the asked offset that the log's rotation dropped before "
        "they were read; the chunk starts after them",
    )
    data: str
    complete: bool = Field(description="the trial has ended and this chunk reaches the end")
