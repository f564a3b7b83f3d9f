"""A sweep's throughput curves: measured by `gpumux tune`, stored, read back."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpumux.fields import (
    MAX_COMMAND_WORDS,
    MAX_SPLIT,
    CommandWord,
    ShortText,
    Workdir,
)
from gpumux.throughput import CurvePoint, ThroughputUnit


def _curve_points(curve: object) -> object:
    """A curve's points checked as CurvePoint.from_json checks what is stored: a point arrives
    as stored JSON (the daemon), as the daemon's answer (the client) or as measured (tune)."""
    if not isinstance(curve, list):
        return curve
    return [
        point if isinstance(point, CurvePoint) else CurvePoint.from_json(point) for point in curve
    ]


class ProfilePublic(BaseModel):
    """A workload's measured throughput against N on one device model, and the best N."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    device_name: str
    fingerprint: str
    workdir: str | None = Field(default=None, description="the directory the command runs in")
    command: list[str]
    param_tokens: list[str] = Field(description="the parameters that change the cost of a trial")
    unit: ThroughputUnit
    curve: list[CurvePoint] = Field(description="one point per N measured, in the order of N")
    best_split: int | None
    oom_at: int | None = Field(
        default=None, description="the smallest N that ran out of memory: never tried again"
    )
    ceiling: int | None = Field(
        default=None, description="the most trials memory was seen to allow: never exceeded"
    )
    context_mb: int | None = Field(
        default=None,
        description="the CUDA context its trials showed (MiB): budgeted beside each slice",
    )
    settled: bool = Field(description="the split search has stopped")
    reason: str | None = Field(description="why the split search made its last decision")
    sweep_id: int | None = Field(description="the sweep that measured it last")
    created_at: datetime
    updated_at: datetime

    @field_validator("curve", mode="before")
    @classmethod
    def _checked_points(cls, curve: object) -> object:
        return _curve_points(curve)


class ProfileMeasured(BaseModel):
    """A curve measured outside a sweep (`gpumux tune`), kept as its workload's profile: the
    next sweep of that command and directory at `auto` starts settled at `best_split`."""

    model_config = ConfigDict(extra="forbid")

    device: str = Field(
        min_length=1, max_length=200, description="the key of the device measured (GET /devices)"
    )
    device_name: str = Field(
        min_length=1,
        max_length=200,
        description="its name: a device of that name stands for it where none has its key "
        "(a simulated GPU's key is its daemon's)",
    )
    workdir: Workdir = Field(description="absolute directory the command ran in")
    command: list[CommandWord] = Field(min_length=1, max_length=MAX_COMMAND_WORDS)
    unit: ThroughputUnit
    curve: list[CurvePoint] = Field(min_length=1, max_length=MAX_SPLIT)
    best_split: int = Field(ge=1, le=MAX_SPLIT)
    reason: ShortText

    @field_validator("curve", mode="before")
    @classmethod
    def _checked_points(cls, curve: object) -> object:
        return _curve_points(curve)

    @model_validator(mode="after")
    def _best_measured(self) -> ProfileMeasured:
        if self.best_split not in {point.split for point in self.curve}:
            raise ValueError(f"best_split {self.best_split} is no N of the curve")
        return self


class ProfilesPublic(BaseModel):
    data: list[ProfilePublic]
    count: int
