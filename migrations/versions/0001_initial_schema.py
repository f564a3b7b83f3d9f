"""initial schema

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import gpumux.storage.models

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "owners",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("uid", sa.Integer(), nullable=True),
        sa.Column("created_at", gpumux.storage.models.UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "queued",
                "running",
                "finished",
                "cancelled",
                name="sweepstatus",
                native_enum=False,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("command", sa.JSON(), nullable=False),
        sa.Column("param_tokens", sa.JSON(), nullable=False),
        sa.Column("workdir", sa.Text(), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        sa.Column("random_trials", sa.Integer(), nullable=True),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("split", sa.Integer(), nullable=True),
        sa.Column("objective_metric", sa.String(length=200), nullable=True),
        sa.Column(
            "objective_mode",
            sa.Enum("min", "max", name="objectivemode", native_enum=False, length=16),
            nullable=True,
        ),
        sa.Column("time_limit_s", sa.Double(), nullable=True),
        sa.Column("trial_count", sa.Integer(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("created_at", gpumux.storage.models.UtcDateTime(), nullable=False),
        sa.Column("finished_at", gpumux.storage.models.UtcDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["owner_id"],
            ["owners.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.create_index("ix_sweeps_owner_id_id", ["owner_id", "id"], unique=False)
        batch_op.create_index("ix_sweeps_status_id", ["status", "id"], unique=False)

    op.create_table(
        "trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "queued",
                "starting",
                "running",
                "succeeded",
                "failed",
                "cancelled",
                "lost",
                name="trialstatus",
                native_enum=False,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("device", sa.String(length=100), nullable=True),
        sa.Column("slot", sa.Integer(), nullable=True),
        sa.Column("split", sa.Integer(), nullable=True),
        sa.Column("memory_limit_mb", sa.Integer(), nullable=True),
        sa.Column("cpu_threads", sa.Integer(), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("pid_started", sa.Integer(), nullable=True),
        sa.Column("token_hash", sa.String(length=64), nullable=True),
        sa.Column("log_path", sa.Text(), nullable=True),
        sa.Column("queued_at", gpumux.storage.models.UtcDateTime(), nullable=False),
        sa.Column("started_at", gpumux.storage.models.UtcDateTime(), nullable=True),
        sa.Column("ended_at", gpumux.storage.models.UtcDateTime(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("signal", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("objective", sa.Double(), nullable=True),
        sa.Column("samples_per_s", sa.Double(), nullable=True),
        sa.Column("last_report_at", gpumux.storage.models.UtcDateTime(), nullable=True),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.create_index("ix_trials_status_id", ["status", "id"], unique=False)
        batch_op.create_index("ix_trials_sweep_id_number", ["sweep_id", "number"], unique=True)
        batch_op.create_index(
            "ix_trials_sweep_id_status_number", ["sweep_id", "status", "number"], unique=False
        )

    op.create_table(
        "trial_reports",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("at", gpumux.storage.models.UtcDateTime(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=True),
        sa.Column("samples", sa.Double(), nullable=True),
        sa.Column("seconds", sa.Double(), nullable=True),
        sa.Column("samples_per_s", sa.Double(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("trial_reports", schema=None) as batch_op:
        batch_op.create_index("ix_trial_reports_trial_id_id", ["trial_id", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("trial_reports", schema=None) as batch_op:
        batch_op.drop_index("ix_trial_reports_trial_id_id")

    op.drop_table("trial_reports")
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.drop_index("ix_trials_sweep_id_status_number")
        batch_op.drop_index("ix_trials_sweep_id_number")
        batch_op.drop_index("ix_trials_status_id")

    op.drop_table("trials")
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.drop_index("ix_sweeps_status_id")
        batch_op.drop_index("ix_sweeps_owner_id_id")

    op.drop_table("sweeps")
    op.drop_table("owners")
