"""Pydantic models of the REST API: what clients send and what they get back."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpumux import sweepspec
from gpumux.fields import (
    ENV_NAME,
    MAX_ARG_BYTES,
    MAX_COMMAND_BYTES,
    MAX_COMMAND_WORDS,
    MAX_COUNT,
    MAX_ENV_BYTES,
    MAX_ENV_ENTRIES,
    MAX_ID,
    MAX_METRICS,
    MAX_NAME_CHARS,
    MAX_REPORT_SECONDS,
    MAX_SAMPLES,
    MAX_SEARCH_OPTIONS,
    MAX_SPLIT,
    MAX_TIME_LIMIT_S,
    CommandWord,
    EnvName,
    EnvValue,
    MetricName,
    ObjectiveMetric,
    ParamToken,
    ShortText,
    UserName,
    Workdir,
    json_integer,
    json_number,
    names_in_property_names,
    quoted,
)
from gpumux.searchspec import split_spec
from gpumux.status import NodeState, ObjectiveMode, SearchMethod, SweepStatus, TrialStatus
from gpumux.sweepplan import Objective, parse_objective
from gpumux.throughput import CurvePoint, ThroughputUnit


class FieldProblem(BaseModel):
    """One reason a request was refused: where in the request, and what is wrong there."""

    loc: list[str | int] = Field(description="where: body, query, path or header, then the field")
    msg: str
    type: str = Field(description="the kind of problem, e.g. too_long, finite_number, value_error")


class Problem(BaseModel):
    """Every error answer has this shape: one line that says what went wrong and what to do,
    and for a refused request each field at fault (the value itself is never echoed)."""

    detail: str
    errors: list[FieldProblem] = Field(default_factory=list)


def _env_names(schema: dict[str, Any]) -> None:
    """The environment's names in the schema as the validators take them."""
    schema["propertyNames"] = {"minLength": 1, "maxLength": MAX_ARG_BYTES - 2, "pattern": ENV_NAME}
    names_in_property_names(schema)


class SweepCreate(BaseModel):
    """A sweep as submitted: the grammar's tokens, the command, and where and how to run it."""

    model_config = ConfigDict(extra="forbid")

    name: ShortText | None = Field(default=None)
    params: list[ParamToken] = Field(
        default_factory=list,
        max_length=sweepspec.MAX_PARAMS,
        description="PARAM tokens, e.g. lr=1e-3..1e-1 "
        f"(at most {sweepspec.MAX_PARAMS_CHARS:,} characters in all)",
    )
    command: list[CommandWord] = Field(
        min_length=1,
        max_length=MAX_COMMAND_WORDS,
        description="argv of the training command; `{name}` is filled with the parameter, "
        f"`{{{{name}}}}` is the literal text `{{name}}` (at most {MAX_COMMAND_BYTES:,} bytes "
        "in all, as UTF-8)",
    )
    workdir: Workdir = Field(description="absolute directory the command runs in")
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict,
        max_length=MAX_ENV_ENTRIES,
        description="environment of the command (each NAME=value at most "
        f"{MAX_ARG_BYTES:,} bytes, {MAX_ENV_BYTES:,} in all, as UTF-8)",
        json_schema_extra=_env_names,
    )
    trials: int | None = Field(
        default=None,
        ge=1,
        le=MAX_COUNT,
        description="how many trials: a random search's draws, an adaptive search's budget",
    )
    search: SearchMethod | None = Field(
        default=None,
        description="grid or random (every trial chosen at submission), or an Optuna sampler "
        "that chooses each next trial as a slot frees: tpe, gp, cmaes, qmc (these need "
        "`trials`); default grid, or random with `trials`. Its options may follow a colon, "
        "as on the command line: tpe:n_startup_trials=4,multivariate=false",
    )
    search_options: dict[ShortText, bool | int | float | ShortText] = Field(
        default_factory=dict,
        max_length=MAX_SEARCH_OPTIONS,
        json_schema_extra=names_in_property_names,
        description="the sampler's constructor options, over gpumux's own (TPE's start-up: a "
        "quarter of the budget, 2 to 10); each checked against the sampler's signature",
    )
    prune: ShortText | None = Field(
        default=None,
        description="stop losing trials at a report: none, median, asha or hyperband, with "
        "Optuna's options after a colon (asha:min_resource=2,reduction_factor=3); needs "
        "`metric` and `mode`",
    )
    seed: int | None = Field(default=None, ge=0, le=MAX_ID)
    split: (
        Annotated[int, Field(json_schema_extra={"minimum": 1, "maximum": MAX_SPLIT})]
        | Literal["auto"]
    ) = Field(default="auto", description="trials per device, or auto")
    metric: ObjectiveMetric | None = Field(
        default=None,
        description="the metric that ranks the trials, as they report it (val_loss); needs "
        '`mode`. The older `objective: "val_loss:min"` is read as metric and mode',
    )
    mode: ObjectiveMode | None = Field(
        default=None, description="min or max: whether less or more of `metric` is better"
    )
    time_limit_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_TIME_LIMIT_S,
        allow_inf_nan=False,
        description="per-trial limit, in seconds (a year at most)",
    )
    retries: int = Field(
        default=0,
        ge=0,
        le=100,
        description="reruns of a trial whose command fails (lost and out-of-memory trials are "
        "rerun anyway)",
    )
    priority: int = Field(
        default=0, ge=-1000, le=1000, description="among your sweeps, higher runs first"
    )
    preload: bool = Field(
        default=False,
        description="start each `python script.py` trial from a helper that has already "
        "imported the framework (the daemon's GPUMUX_PRELOAD); other commands start fresh",
    )

    _integers = field_validator("trials", "seed", "split", "retries", "priority", mode="before")(
        json_integer
    )
    _numbers = field_validator("time_limit_s", mode="before")(json_number)

    @field_validator("name")
    @classmethod
    def _name_not_an_id(cls, name: str | None) -> str | None:
        if name is not None and name.strip().isdecimal():
            raise ValueError(
                f"a sweep named {name.strip()!r} could not be told from sweep id "
                f"{name.strip()}; give a name with a letter in it"
            )
        return name

    @field_validator("command")
    @classmethod
    def _command_runnable(cls, command: list[str]) -> list[str]:
        if not command[0].strip():
            raise ValueError("the command's first word is empty; give the program to run")
        size = sum(len(word.encode()) + 1 for word in command)
        if size > MAX_COMMAND_BYTES:
            raise ValueError(
                f"the command takes {size:,} bytes, over the limit of {MAX_COMMAND_BYTES:,}; "
                "pass large data in a file"
            )
        return command

    @field_validator("env")
    @classmethod
    def _env_passable(cls, env: dict[str, str]) -> dict[str, str]:
        total = 0
        for name, value in env.items():
            if "=" in name:
                raise ValueError(
                    f"environment variable {quoted(name)} cannot be passed to a process "
                    "('=' in its name)"
                )
            entry = len(name.encode()) + len(value.encode()) + 2
            if entry > MAX_ARG_BYTES:
                raise ValueError(
                    f"environment variable {quoted(name)} takes {entry:,} bytes, over the "
                    f"{MAX_ARG_BYTES:,} a process accepts; pass large data in a file"
                )
            total += entry
        if total > MAX_ENV_BYTES:
            raise ValueError(
                f"the environment takes {total:,} bytes, over the limit of {MAX_ENV_BYTES:,}; "
                "unset the variables the command does not need"
            )
        return env

    @field_validator("workdir")
    @classmethod
    def _workdir_absolute(cls, workdir: str) -> str:
        if not workdir.startswith("/"):
            raise ValueError("workdir must be an absolute path, starting with /")
        return workdir

    @field_validator("split")
    @classmethod
    def _split_in_range(cls, split: int | Literal["auto"]) -> int | Literal["auto"]:
        if split != "auto" and not 1 <= split <= MAX_SPLIT:
            raise ValueError(f"split must be 1..{MAX_SPLIT} or 'auto'")
        return split

    @model_validator(mode="before")
    @classmethod
    def _objective_apart(cls, data: Any) -> Any:
        """The older `objective: "val_loss:min"` is the metric and the mode in one word."""
        if not (isinstance(data, dict) and "objective" in data):
            return data
        data = dict(data)
        objective = data.pop("objective")
        if objective is None:
            return data
        if not isinstance(objective, str):
            raise ValueError("objective must be text: METRIC:min or METRIC:max")
        if data.get("metric") is not None or data.get("mode") is not None:
            raise ValueError("the objective is given twice: as objective and as metric and mode")
        metric, mode = parse_objective(objective)
        return {**data, "metric": metric, "mode": mode}

    @model_validator(mode="after")
    def _metric_with_mode(self) -> SweepCreate:
        if (self.metric is None) != (self.mode is None):
            raise ValueError(
                "metric and mode go together: give both (metric val_loss, mode min or max), "
                "or neither"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _search_options_apart(cls, data: Any) -> Any:
        """`search: "tpe:n_startup_trials=4"` is the method and its options in one word."""
        if not (isinstance(data, dict) and isinstance(search := data.get("search"), str)):
            return data
        if ":" not in search:
            return data
        if len(search) > MAX_NAME_CHARS:
            raise ValueError(
                f"search takes at most {MAX_NAME_CHARS} characters with its options, not "
                f"{len(search):,}; give fewer options"
            )
        if data.get("search_options"):
            raise ValueError(
                "the sampler's options are given twice: after search's colon and in "
                "search_options; keep one"
            )
        method, options = split_spec(search, flag="--search", example="n_startup_trials=4")
        return {**data, "search": method, "search_options": options}


# The frameworks whose runtime hook reports that it sees no GPU (gpumux.runtime.frameworks).
NoGpuFramework = Literal["tensorflow", "torch"]


class NoGpuPublic(BaseModel):
    """A framework that saw no GPU in a sweep's trials placed on one, and what to install."""

    framework: NoGpuFramework
    trials: int = Field(description="the sweep's trials in which it saw no GPU")
    fix: str = Field(description="what to install for the framework to see the GPU")


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


class SweepPublic(BaseModel):
    """A sweep with the number of its trials in each status."""

    id: int
    name: str | None
    owner: str
    status: SweepStatus
    command: list[str]
    params: list[str]
    workdir: str
    trials: int | None
    search: SearchMethod = SearchMethod.grid
    search_options: dict[str, bool | int | float | str] = Field(
        default_factory=dict, description="the sampler's options the sweep set"
    )
    prune: str | None = None
    seed: int
    split: int | Literal["auto"]
    metric: str | None = Field(description="the metric that ranks the trials")
    mode: ObjectiveMode | None = Field(description="min or max: which way is better")
    time_limit_s: float | None
    retries: int = 0
    priority: int = 0
    preload: bool = False
    trial_count: int = Field(
        description="every trial of the sweep; an adaptive search's budget, of which only "
        "those asked so far exist"
    )
    cancel_requested: bool
    created_at: datetime
    finished_at: datetime | None
    counts: dict[TrialStatus, int]

    @property
    def objective(self) -> Objective | None:
        """The metric and mode together, where the sweep has them."""
        if self.metric is None or self.mode is None:
            return None
        return Objective(self.metric, self.mode)


class SweepDetail(SweepPublic):
    best: TrialPublic | None
    profiles: list[ProfilePublic] = Field(
        default_factory=list,
        description="for --split auto: the split search's curve of this workload per device model",
    )
    no_gpu: list[NoGpuPublic] = Field(
        default_factory=list,
        description="frameworks that saw no GPU in trials gpumux placed on one: they trained "
        "on the CPU",
    )


class SweepsPublic(BaseModel):
    data: list[SweepPublic]
    count: int


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
    metrics: dict[MetricName, float] = Field(
        default_factory=dict,
        max_length=MAX_METRICS,
        json_schema_extra=names_in_property_names,
        description="metrics by name; values that are not finite numbers are dropped",
    )

    _integers = field_validator("trial_id", "attempt", "step", mode="before")(json_integer)
    _numbers = field_validator("samples", "seconds", "steps", mode="before")(json_number)

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


class DeviceTrial(BaseModel):
    trial_id: int
    sweep_id: int
    slot: int | None
    memory_limit_mb: int | None
    samples_per_s: float | None


class DeviceShare(BaseModel):
    """The trials of one sweep launched at one split on a device, and the part of it they hold."""

    sweep_id: int
    owner: str | None = Field(
        description="the sweep's owner; null for another user's sweep (only admins see whose)"
    )
    name: str | None = Field(description="the sweep's name; null when unnamed or not the caller's")
    split: int = Field(description="the N its trials were launched under: each holds 1/N")
    trials: int = Field(description="how many of its trials hold a slot on the device")
    share: float = Field(description="trials/split: the part of the device they hold")


class DevicePublic(BaseModel):
    """A device as last probed, with the trials packed on it and the mix of sweeps they are."""

    key: str
    kind: str = Field(description="how trials share it: gpu (memory slices) or cpu (threads)")
    index: int
    name: str
    uuid: str | None
    memory_total_mb: int | None
    memory_used_mb: int | None
    memory_free_mb: int | None
    utilization_pct: int | None
    cpu_count: int | None = Field(
        description="the host's cores its trials share: all of them for the CPU device, an "
        "equal block of them for each GPU; a trial gets 1/N as threads"
    )
    error: str | None
    trials: list[DeviceTrial]
    mix: list[DeviceShare] = Field(description="the sweeps on the device, by sweep id and split")
    load: float = Field(description="the sum of the mix's shares: 1 is a full device")
    load_fraction: str = Field(description='the load as an exact fraction: "0", "5/6", "1"')
    node: str | None = Field(
        default=None, description="the node the device is on; null for a daemon that is no node"
    )


class NodeDevice(BaseModel):
    """A device as its node's probe saw it at its last heartbeat."""

    key: str
    kind: str
    name: str
    memory_mb: int | None = None


class NodePublic(BaseModel):
    """A daemon on the shared database: where it serves, its devices, its lease and its load."""

    id: int
    name: str
    state: NodeState
    incarnation: int
    url: str | None = Field(description="where its API serves the other nodes; null: no TCP")
    pid: int
    devices: list[NodeDevice]
    started_at: datetime
    heartbeat_at: datetime
    lease_until: datetime
    live: bool = Field(description="active and its lease not yet run out, now")
    active_trials: int = Field(description="how many trials hold a slot on it")


class Health(BaseModel):
    status: Literal["ok"]
    version: str
    database: str
    devices: int
    queued_trials: int
    active_trials: int


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


SweepDetail.model_rebuild()


class TokenCreate(BaseModel):
    user: UserName | None = Field(default=None, description="whose token (default: yours)")


class TokenCreated(BaseModel):
    user: str
    token: str = Field(description="shown once: only its hash is stored")


class TokensRevoked(BaseModel):
    user: str
    revoked: int
