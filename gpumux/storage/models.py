"""SQLAlchemy models: owners, sweeps, trials, the reports trials send, throughput profiles, and
the node daemons that share the database."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    false,
)
from sqlalchemy import Enum as SqlEnum
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from gpumux.status import NodeState, ObjectiveMode, SearchMethod, SweepStatus, TrialStatus


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


def token_hash(token: str) -> str:
    """The stored form of a secret (an API token, a trial's report token, a node's secret):
    the rows keep only this."""
    return hashlib.sha256(token.encode()).hexdigest()


class UtcDateTime(TypeDecorator[datetime]):
    """Stores naive UTC (SQLite has no time zones) and hands back aware UTC datetimes."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


# Ids, and the integers that outgrow 2**31 - 1 (a uid, a seed, start ticks after 248 days up, a
# byte offset): PostgreSQL's BIGINT; SQLite's INTEGER is 64-bit already, and an INTEGER PRIMARY
# KEY must stay one to be the rowid.
WIDE = BigInteger().with_variant(Integer(), "sqlite")


def _enum_column(enum: type[Enum]) -> SqlEnum:
    """A VARCHAR holding the enum's values (not its names), read back as enum members."""
    return SqlEnum(
        enum,
        native_enum=False,
        length=16,
        values_callable=lambda members: [member.value for member in members],
    )


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UtcDateTime, dict[str, Any]: JSON, list[str]: JSON}


class Owner(Base):
    __tablename__ = "owners"

    id: Mapped[int] = mapped_column(WIDE, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    uid: Mapped[int | None] = mapped_column(WIDE)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiToken(Base):
    """A secret that identifies its owner over TCP; only its SHA-256 is stored."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(WIDE, primary_key=True)
    owner_id: Mapped[int] = mapped_column(WIDE, ForeignKey("owners.id", ondelete="CASCADE"))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]

    owner: Mapped[Owner] = relationship(lazy="joined")


class Sweep(Base):
    __tablename__ = "sweeps"
    __table_args__ = (
        Index("ix_sweeps_owner_id_id", "owner_id", "id"),
        Index("ix_sweeps_status_id", "status", "id"),
    )

    id: Mapped[int] = mapped_column(WIDE, primary_key=True)
    name: Mapped[str | None] = mapped_column(String(200))
    owner_id: Mapped[int] = mapped_column(WIDE, ForeignKey("owners.id"))
    status: Mapped[SweepStatus] = mapped_column(
        _enum_column(SweepStatus), default=SweepStatus.queued
    )
    command: Mapped[list[str]]
    param_tokens: Mapped[list[str]]
    workdir: Mapped[str] = mapped_column(Text)
    env: Mapped[dict[str, Any]]
    # --trials: a random search's draws or an adaptive search's budget; None for a grid.
    trial_budget: Mapped[int | None]
    search: Mapped[SearchMethod] = mapped_column(
        _enum_column(SearchMethod), default=SearchMethod.grid, server_default="grid"
    )
    # The sampler's options the sweep set, checked, e.g. {"n_startup_trials": 4}; None: none.
    search_options: Mapped[dict[str, Any] | None]
    # The pruner as given, e.g. "asha:min_resource=2"; None: trials run to their end.
    prune: Mapped[str | None] = mapped_column(String(200))
    # An adaptive sweep's Optuna study-level system attributes (a QMC sampler's position).
    study_attrs: Mapped[dict[str, Any] | None]
    seed: Mapped[int] = mapped_column(WIDE)
    split: Mapped[int | None]
    objective_metric: Mapped[str | None] = mapped_column(String(200))
    objective_mode: Mapped[ObjectiveMode | None] = mapped_column(_enum_column(ObjectiveMode))
    time_limit_s: Mapped[float | None]
    # Requeues of a trial whose script failed; lost and out-of-memory trials have their own.
    retries: Mapped[int] = mapped_column(default=0, server_default="0")
    # Among one owner's sweeps, higher runs first; FIFO within a priority.
    priority: Mapped[int] = mapped_column(default=0, server_default="0")
    # Its trials start from the preloading spawner, where the framework is already imported.
    preload: Mapped[bool] = mapped_column(default=False, server_default=false())
    # Every trial of a grid or random sweep; an adaptive sweep's budget (its trials are asked
    # as slots free, so fewer may exist yet).
    trial_count: Mapped[int]
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]

    owner: Mapped[Owner] = relationship(lazy="joined")


class Node(Base):
    """One daemon on the shared database: what it offers, where it serves, and its lease."""

    __tablename__ = "nodes"

    id: Mapped[int] = mapped_column(WIDE, primary_key=True)
    # Unique: the hostname, or GPUMUX_NODE_NAME (two daemons on one host need two names).
    name: Mapped[str] = mapped_column(String(255), unique=True)
    # A random id kept in the node's data directory: a restart of the same node takes its row
    # back; another machine under the same name is refused while this one's lease holds.
    home_id: Mapped[str] = mapped_column(String(36))
    # Bumped at each join: writes of an incarnation whose lease was lost are refused.
    incarnation: Mapped[int] = mapped_column(default=1)
    state: Mapped[NodeState] = mapped_column(_enum_column(NodeState), default=NodeState.active)
    # Where its API serves the other nodes (log forwarding), None when only on a Unix socket.
    url: Mapped[str | None] = mapped_column(Text)
    # SHA-256 of the secret this incarnation shows another node it asks (for a trial's log).
    token_hash: Mapped[str | None] = mapped_column(String(64))
    pid: Mapped[int]
    # What its device probe saw at the last heartbeat: [{key, kind, name, memory_mb}, ...].
    devices: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)
    lease_until: Mapped[datetime]


class Trial(Base):
    __tablename__ = "trials"
    __table_args__ = (
        # A node's own active trials: what it reaps, reconciles and places against.
        Index("ix_trials_node_id_status", "node_id", "status"),
        Index("ix_trials_sweep_id_status_number", "sweep_id", "status", "number"),
        Index("ix_trials_sweep_id_number", "sweep_id", "number", unique=True),
        Index("ix_trials_status_id", "status", "id"),
        # The split search counts the trials that ended on a device in a recent window.
        Index("ix_trials_ended_at", "ended_at"),
    )

    id: Mapped[int] = mapped_column(WIDE, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(WIDE, ForeignKey("sweeps.id", ondelete="CASCADE"))
    number: Mapped[int]
    params: Mapped[dict[str, Any]]
    status: Mapped[TrialStatus] = mapped_column(
        _enum_column(TrialStatus), default=TrialStatus.queued
    )
    attempt: Mapped[int] = mapped_column(default=1)
    # The node that claimed the current attempt: the only writer of its lifecycle.
    # Named as migration 0008 named it: a new database is made from these models.
    node_id: Mapped[int | None] = mapped_column(
        WIDE, ForeignKey("nodes.id", ondelete="SET NULL", name="fk_trials_node_id_nodes")
    )
    device: Mapped[str | None] = mapped_column(String(100))
    slot: Mapped[int | None]
    split: Mapped[int | None]
    memory_limit_mb: Mapped[int | None]
    cpu_threads: Mapped[int | None]
    pid: Mapped[int | None]
    pid_started: Mapped[int | None] = mapped_column(WIDE)
    failures: Mapped[int] = mapped_column(default=0, server_default="0")
    token_hash: Mapped[str | None] = mapped_column(String(64))
    log_path: Mapped[str | None] = mapped_column(Text)
    queued_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    exit_code: Mapped[int | None]
    signal: Mapped[int | None]
    error: Mapped[str | None] = mapped_column(Text)
    objective: Mapped[float | None]
    samples_per_s: Mapped[float | None]
    # Optimizer steps/s, counted by the runtime where the script reports no samples (PyTorch).
    steps_per_s: Mapped[float | None]
    last_report_at: Mapped[datetime | None]
    # The last step (epoch or iteration) the current attempt reported.
    step: Mapped[int | None]
    # Bytes of the current attempt's log already read for report lines.
    log_scanned: Mapped[int] = mapped_column(WIDE, default=0, server_default="0")
    # Reports over the trial's budget (GPUMUX_REPORT_*), not stored: their samples still count.
    reports_dropped: Mapped[int] = mapped_column(WIDE, default=0, server_default="0")
    # The framework that saw no GPU on the GPU the trial was placed on: its rates are the CPU's.
    no_gpu: Mapped[str | None] = mapped_column(String(16))
    # What the current attempt's framework last said it holds in its memory pool on the device
    # (MiB), and when: NVML's figure for the process less this is its CUDA context.
    pool_mb: Mapped[int | None]
    pool_at: Mapped[datetime | None]
    # The Optuna trial's system attributes (a sampler's or pruner's state), for rebuilding.
    optuna_attrs: Mapped[dict[str, Any] | None]

    sweep: Mapped[Sweep] = relationship()


class TrialReport(Base):
    __tablename__ = "trial_reports"
    __table_args__ = (
        Index("ix_trial_reports_trial_id_id", "trial_id", "id"),
        # The split search sums the samples reported in a recent window, every scheduler tick.
        Index("ix_trial_reports_at", "at"),
    )

    id: Mapped[int] = mapped_column(WIDE, primary_key=True)
    trial_id: Mapped[int] = mapped_column(WIDE, ForeignKey("trials.id", ondelete="CASCADE"))
    attempt: Mapped[int]
    kind: Mapped[str] = mapped_column(String(16))
    at: Mapped[datetime] = mapped_column(default=utcnow)
    step: Mapped[int | None]
    samples: Mapped[float | None]
    seconds: Mapped[float | None]
    samples_per_s: Mapped[float | None]
    steps: Mapped[float | None]
    metrics: Mapped[dict[str, Any]]


class Profile(Base):
    """The measured throughput curve of one workload on one device model, and its best split."""

    __tablename__ = "profiles"
    __table_args__ = (
        Index("ix_profiles_device_name_fingerprint", "device_name", "fingerprint", unique=True),
    )

    id: Mapped[int] = mapped_column(WIDE, primary_key=True)
    device_name: Mapped[str] = mapped_column(String(200))
    fingerprint: Mapped[str] = mapped_column(String(64))
    # The directory the workload's command runs in (None: a profile made without one).
    workdir: Mapped[str | None] = mapped_column(Text)
    command: Mapped[list[str]]
    param_tokens: Mapped[list[str]]
    unit: Mapped[str] = mapped_column(String(16))
    # [{"split", "throughput", "seconds_per_trial", "memory_per_trial_mb"}, ...]
    curve: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    best_split: Mapped[int | None]
    # The smallest N that ran out of memory, and the most trials memory was seen to allow:
    # the next search of the workload never climbs into either.
    oom_at: Mapped[int | None]
    ceiling: Mapped[int | None]
    # The largest CUDA context its trials showed (MiB; None: not measured): the next search
    # fits by it and placement budgets it beside each slice from the first trial on.
    context_mb: Mapped[int | None]
    settled: Mapped[bool] = mapped_column(default=False)
    reason: Mapped[str | None] = mapped_column(Text)
    sweep_id: Mapped[int | None] = mapped_column(WIDE, ForeignKey("sweeps.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
