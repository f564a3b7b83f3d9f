"""Settings: one object, built at the entry point from GPUMUX_* variables and passed in."""

from __future__ import annotations

import math
import os
import re
import socket
from pathlib import Path
from urllib.parse import quote, unquote

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpumux.devices.simulated.model import ModelError
from gpumux.devices.simulated.state import load_model, shipped_models
from gpumux.home.layout import Layout

DEFAULT_PORT = 7683
# A database given as a URL rather than a file: a scheme, then "://" (RFC 3986's scheme syntax).
URL_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
# Where deploy/gpumux.service serves a shared server's users; the CLI looks there too.
SHARED_SOCKET = Path("/run/gpumux/gpumux.sock")
# The API reads at most this much of a request's body by default (GPUMUX_MAX_BODY_BYTES): a
# sweep's parameters, command and environment fit in far less.
MAX_BODY_BYTES = 1024 * 1024
# Below this even an ordinary sweep with its user's environment would be refused.
MIN_BODY_BYTES = 64 * 1024


class SharesError(ValueError):
    """A fair-share setting that cannot be read; the message says which part and why."""


def parse_shares(text: str) -> dict[str, float]:
    """Fair-share weights from "alice:2,bob:1" (GPUMUX_SHARES); users not named get 1."""
    shares: dict[str, float] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, colon, weight = (part.strip() for part in item.partition(":"))
        if not colon or not name or not weight:
            raise SharesError(f"shares: {item.strip()!r} is not user:weight (as in alice:2,bob:1)")
        try:
            value = float(weight)
        except ValueError:
            raise SharesError(f"shares: {name}'s weight {weight!r} is not a number") from None
        if not math.isfinite(value) or value <= 0:
            raise SharesError(f"shares: the weight of {name} must be above 0, got {weight}")
        if name in shares:
            raise SharesError(f"shares: {name} is given twice")
        shares[name] = value
    return shares


def default_home() -> Path:
    """The XDG data directory for gpumux: $XDG_DATA_HOME/gpumux or ~/.local/share/gpumux."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "gpumux"


class Settings(BaseSettings):
    """Everything configurable, from the environment (GPUMUX_ prefix) or from flags."""

    model_config = SettingsConfigDict(env_prefix="GPUMUX_", extra="ignore")

    home: Path = Field(default_factory=default_home, description="data directory")
    # Before db, whose validator reads it.
    database_url: str = Field(
        default="",
        description="SQLAlchemy URL of the database (default: sqlite:///HOME/gpumux.db, or the "
        "SQLite file GPUMUX_DB names)",
    )
    db: Path | str | None = Field(
        default=None,
        description="the database: an SQLite file, or a URL with a scheme "
        "(postgresql+psycopg://USER@HOST/DATABASE), as GPUMUX_DATABASE_URL",
    )
    url: str = Field(
        default="",
        description="where the CLI finds the daemon: unix:/path/to.sock (default: a socket in "
        "the data directory, which only its owner can open) or http://HOST:PORT",
    )
    host: str = "127.0.0.1"
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535, description="TCP port (0: any free)")
    uds: Path | None = None
    gpus: str | None = Field(
        default=None,
        description="GPUs this daemon may use (CUDA_VISIBLE_DEVICES syntax: indices or UUIDs); "
        "default: the daemon's own CUDA_VISIBLE_DEVICES",
    )

    default_split: int = Field(
        default=2, ge=1, description="trials per GPU when a sweep fixes none"
    )
    cpu_split: int | None = Field(
        default=None, ge=1, description="trials on the CPU device when a sweep fixes none"
    )
    cpu_affinity: bool = Field(
        default=False,
        description="pin each trial to its own block of its device's cores (its threads' worth)",
    )
    overhead_mb: int = Field(default=1024, ge=0, description="per-process memory beyond the slice")
    reserve_mb: int = Field(default=512, ge=0, description="memory left free on every GPU")
    min_memory_mb: int = Field(default=256, ge=1)
    max_grid: int = Field(default=10_000, ge=1, description="largest grid a sweep may expand to")
    poll_interval: float = Field(default=1.0, gt=0, description="seconds between device polls")
    kill_grace: float = Field(default=10.0, ge=0, description="seconds from SIGTERM to SIGKILL")
    lost_retries: int = Field(default=2, ge=0, description="requeues of a trial cut off by a stop")
    log_tail_lines: int = Field(default=20, ge=1, description="log lines kept with a failed trial")

    tune: bool = Field(default=True, description="--split auto searches N; off: the default N")
    tune_warmup: float = Field(default=2.0, ge=0, description="seconds ignored after N changes")
    tune_window: float = Field(default=5.0, gt=0, description="seconds measured at each N")
    tune_threshold: float = Field(default=0.05, gt=0, description="gain that justifies a larger N")
    host_cores: int | None = Field(
        default=None, ge=1, description="cores the split search's first N counts (default: usable)"
    )
    cpu_trial_mb: int = Field(
        default=1024, ge=1, description="memory a trial needs on the CPU device (bounds N)"
    )
    oom_retries: int = Field(default=3, ge=0, description="requeues of a trial out of memory")

    stop_trials: bool = Field(
        default=False,
        description="a warm stop also stops running trials (default: they run on under their "
        "supervisors and the next daemon adopts them)",
    )
    leave_when_idle: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="a daemon leaves (a warm stop) once no trial has been queued or running "
        "on its whole database for this many seconds (default: it serves until stopped)",
    )
    heartbeat_interval: float = Field(
        default=5.0, gt=0, description="seconds between a supervisor's heartbeats"
    )
    heartbeat_timeout: float = Field(
        default=60.0, gt=0, description="a supervisor silent this long is lost"
    )
    log_max_mb: float = Field(
        default=100.0, gt=0, description="a trial log is rotated when it reaches this size"
    )
    log_keep: int = Field(default=2, ge=0, description="rotated pieces kept of each trial log")
    warm_preload: str = Field(
        # Keras is its own package since TensorFlow 2.16, imported by `import keras`.
        default="tensorflow,keras",
        description="modules the warm spawner imports before it forks the trials of --warm "
        "sweeps (comma list; from the daemon's own environment)",
    )

    admins: str = Field(default="", description="users who see and cancel all work (comma list)")
    admin_group: str | None = Field(
        default=None, description="members of this Unix group are admins"
    )
    accept_users: str = Field(
        default="",
        description="other users a daemon not running as root accepts (comma list); their "
        "trials run as the daemon's user",
    )
    shares: str = Field(
        default="", description="fair-share weights, user:weight comma list (default 1 each)"
    )
    max_running_per_user: int | None = Field(
        default=None, ge=1, description="concurrent trials one user may hold"
    )
    max_queued_per_user: int | None = Field(
        default=None, ge=1, description="trials one user may have waiting"
    )
    report_rate: float = Field(
        default=20.0,
        gt=0,
        allow_inf_nan=False,
        description="report rows a trial may add per second, sustained (printed or posted), "
        "beyond a row per new step; over it a report of the step its latest row holds updates "
        "that row, any other is dropped and counted",
    )
    report_burst: int = Field(
        default=200, ge=1, description="report rows a trial may add at once before the rate applies"
    )
    report_rows: int = Field(
        default=20_000,
        ge=1,
        description="report rows kept per trial attempt; past it only its latest row is updated",
    )
    max_body_bytes: int = Field(
        default=MAX_BODY_BYTES,
        ge=MIN_BODY_BYTES,
        description="largest request body the API reads; a larger one is refused (413) unread",
    )

    simulated_gpu: str | None = Field(
        default=None,
        description="serve one simulated GPU instead of the host's devices, for development "
        "and benchmarks: a model file (JSON) or a shipped model's name ("
        + ", ".join(shipped_models())
        + "); its trials must be python -m gpumux.devices.simulated.trial",
    )
    simulated_time_scale: float = Field(
        default=1.0,
        gt=0,
        allow_inf_nan=False,
        description="real seconds per simulated second on the simulated GPU (0.25: four times "
        "faster; the split search's own timers are not scaled)",
    )

    node_name: str = Field(
        default_factory=socket.gethostname,
        min_length=1,
        max_length=255,
        description="this daemon's name among the nodes sharing its database (default: the "
        "hostname; two daemons on one host need two names)",
    )
    node_heartbeat: float = Field(
        default=5.0, gt=0, description="seconds between renewals of this node's lease"
    )
    node_lease: float = Field(
        default=30.0,
        gt=0,
        description="seconds a node's lease lasts unrenewed; past it, other nodes requeue its "
        "trials (more than two heartbeats)",
    )

    @field_validator("warm_preload")
    @classmethod
    def _warm_preload_names(cls, text: str) -> str:
        for name in text.split(","):
            if not all(part.isidentifier() for part in name.strip().split(".")):
                raise ValueError(
                    f"warm_preload: {name.strip()!r} is not a module name; give modules as "
                    "in tensorflow,numpy"
                )
        return text

    @field_validator("simulated_gpu")
    @classmethod
    def _simulated_model_loads(cls, model: str | None) -> str | None:
        if model is not None:
            try:
                load_model(model)
            except ModelError as error:
                raise ValueError(f"simulated_gpu: {error}") from None
        return model

    @field_validator("shares")
    @classmethod
    def _shares_parse(cls, shares: str) -> str:
        parse_shares(shares)
        return shares

    @model_validator(mode="after")
    def _lease_outlasts_heartbeats(self) -> Settings:
        # One late heartbeat (a slow database, a busy host) must not cost a node its trials.
        if self.node_lease <= 2 * self.node_heartbeat:
            raise ValueError(
                f"GPUMUX_NODE_LEASE ({self.node_lease:g} s) must exceed two heartbeats "
                f"(2 x GPUMUX_NODE_HEARTBEAT = {2 * self.node_heartbeat:g} s); raise the lease "
                "or shorten the heartbeat"
            )
        return self

    @model_validator(mode="after")
    def _default_url(self) -> Settings:
        if not self.url:
            self.url = f"unix:{self.layout.socket}"
        return self

    @property
    def share_weights(self) -> dict[str, float]:
        """The fair-share weight of each user named in `shares`."""
        return parse_shares(self.shares)

    @field_validator("db", mode="before")
    @classmethod
    def _db_as_text(cls, db: object) -> object:
        # A file from the CLI (a Path) and one from GPUMUX_DB (text) are read alike.
        return str(db) if isinstance(db, Path) else db

    @field_validator("db")
    @classmethod
    def _db_or_database_url(cls, db: str | None, info: ValidationInfo) -> str | None:
        if db is not None and info.data.get("database_url"):
            raise ValueError(
                "GPUMUX_DATABASE_URL names a database too; give --db (GPUMUX_DB) or "
                "GPUMUX_DATABASE_URL, not both"
            )
        return db

    @model_validator(mode="after")
    def _database_url(self) -> Settings:
        # Derived here, once: everything else reads database_url alone.
        if not self.database_url and self.db is not None and URL_SCHEME.match(str(self.db)):
            self.database_url = str(self.db)
        elif not self.database_url:
            file = Path(self.db) if self.db is not None else self.layout.database
            # Quoted: a file name may hold '%', '?' or '#', which a URL reads otherwise.
            self.database_url = f"sqlite:///{quote(str(file))}"
        return self

    @property
    def database_file(self) -> Path | None:
        """The SQLite file of the database URL, None for a database kept by a server.

        The CLI finds a daemon through the lock beside that file without importing the storage.
        """
        scheme, _, rest = self.database_url.partition(":///")
        if scheme not in {"sqlite", "sqlite+pysqlite"}:
            return None
        path = unquote(rest.split("?", 1)[0])
        return Path(path) if path and path != ":memory:" else None

    @property
    def warm_modules(self) -> list[str]:
        """The modules the warm spawner preloads, in order."""
        return [name.strip() for name in self.warm_preload.split(",")]

    @property
    def layout(self) -> Layout:
        """The paths of the data directory's files."""
        return Layout(self.home)
