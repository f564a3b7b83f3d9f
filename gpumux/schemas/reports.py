"""What a trial's runtime reports (POST /reports) and what is read back."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpumux.fields import (
    MAX_COUNT,
    MAX_ID,
    MAX_METRICS,
    MAX_REPORT_SECONDS,
    MAX_SAMPLES,
    MAX_UNIX_TIME,
    MetricName,
    json_integer,
    json_number,
    names_in_property_names,
)
from gpumux.schemas.common import NoGpuFramework

ReportKind = Literal["batch", "epoch", "manual", "line", "steps", "device"]


class ReportIn(BaseModel):
    """What a trial's runtime sends: samples processed in `seconds`, and its metrics at a step."""

    trial_id: int = Field(ge=1, le=MAX_ID)
    attempt: int = Field(ge=1, le=MAX_COUNT)
    kind: ReportKind = Field(
        description="batch or epoch (the Keras hook), manual (gpumux.runtime.report), "
        "line (a GPUMUX_REPORT line the trial printed), steps (PyTorch's optimizer steps, "
        "counted by the runtime), device (what the trial's framework sees of its device)"
    )
    step: int | None = Field(
        default=None,
        ge=0,
        le=2**31 - 1,
        description="the epoch or iteration (from 0) the metrics belong to",
    )
    samples: float | None = Field(
        default=None,
        ge=0,
        le=MAX_SAMPLES,
        allow_inf_nan=False,
        description="samples processed since the previous report",
    )
    seconds: float | None = Field(
        default=None,
        ge=0,
        le=MAX_REPORT_SECONDS,
        allow_inf_nan=False,
        description="the interval the samples (or steps) took",
    )
    steps: float | None = Field(
        default=None,
        ge=0,
        le=MAX_SAMPLES,
        allow_inf_nan=False,
        description="optimizer steps taken since the previous report, counted by the runtime",
    )
    no_gpu: NoGpuFramework | None = Field(
        default=None,
        description="the framework that sees no GPU, though gpumux placed the trial on one",
    )
    pool_mb: int | None = Field(
        default=None,
        ge=0,
        le=MAX_COUNT,
        description="the device memory (MiB) the trial's framework holds now in its pool, "
        "PyTorch's memory_reserved(): what its slice must hold; the rest of what NVML shows "
        "of the process is its CUDA context",
    )
    pool_at: float | None = Field(
        default=None,
        ge=0,
        le=MAX_UNIX_TIME,
        allow_inf_nan=False,
        description="when pool_mb was read, as Unix time (the report's arrival if absent or later)",
    )
    metrics: dict[MetricName, float] = Field(
        default_factory=dict,
        max_length=MAX_METRICS,
        json_schema_extra=names_in_property_names,
        description="metrics by name; values that are not finite numbers are dropped",
    )

    _integers = field_validator("trial_id", "attempt", "step", "pool_mb", mode="before")(
        json_integer
    )
    _numbers = field_validator("samples", "seconds", "steps", "pool_at", mode="before")(json_number)

    @field_validator("metrics", mode="before")
    @classmethod
    def _numbers_only(cls, metrics: object) -> object:
        if isinstance(metrics, dict):
            for value in metrics.values():
                json_number(value)
        return metrics

    @field_validator("metrics")
    @classmethod
    def _finite(cls, metrics: dict[str, float]) -> dict[str, float]:
        return {name: value for name, value in metrics.items() if math.isfinite(value)}


class ReportPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    attempt: int
    kind: str
    at: datetime
    step: int | None
    samples: float | None
    seconds: float | None
    samples_per_s: float | None
    steps: float | None = None
    metrics: dict[str, float]


class ReportsPublic(BaseModel):
    data: list[ReportPublic]
    count: int
