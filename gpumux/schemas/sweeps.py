"""A sweep as submitted (POST /sweeps) and as answered, with its best trial and profiles."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpumux.fields import (
    ENV_NAME,
    MAX_ARG_BYTES,
    MAX_COMMAND_BYTES,
    MAX_COMMAND_WORDS,
    MAX_COUNT,
    MAX_ENV_BYTES,
    MAX_ENV_ENTRIES,
    MAX_ID,
    MAX_NAME_CHARS,
    MAX_SEARCH_OPTIONS,
    MAX_SPLIT,
    MAX_TIME_LIMIT_S,
    CommandWord,
    EnvName,
    EnvValue,
    ObjectiveMetric,
    ParamToken,
    ShortText,
    Workdir,
    json_integer,
    json_number,
    names_in_property_names,
)
from gpumux.grammar import sweepspec
from gpumux.grammar.searchspec import split_spec
from gpumux.grammar.sweepplan import Objective, parse_objective
from gpumux.schemas.common import NoGpuFramework
from gpumux.schemas.profiles import ProfilePublic
from gpumux.schemas.trials import TrialPublic
from gpumux.status import ObjectiveMode, SearchMethod, SweepStatus, TrialStatus
from gpumux.text import quoted


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
    def _not_an_older_command_line(cls, data: Any) -> Any:
        """`warm` is what a gpumux command line older than this daemon sends (now `preload`):
        say so, rather than only that the field is unknown."""
        if isinstance(data, dict) and "warm" in data:
            raise ValueError(
                "warm is now preload: this request comes from an older gpumux than the "
                "daemon's; upgrade gpumux where the command runs"
            )
        return data

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


class NoGpuPublic(BaseModel):
    """A framework that saw no GPU in a sweep's trials placed on one, and what to install."""

    framework: NoGpuFramework
    trials: int = Field(description="the sweep's trials in which it saw no GPU")
    fix: str = Field(description="what to install for the framework to see the GPU")


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
