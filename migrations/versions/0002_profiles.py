"""throughput profiles; indexes for the tuner's time windows

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import gpumux.storage.models

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "profiles",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("device_name", sa.String(length=200), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("command", sa.JSON(), nullable=False),
        sa.Column("param_tokens", sa.JSON(), nullable=False),
        sa.Column("unit", sa.String(length=16), nullable=False),
        sa.Column("curve", sa.JSON(), nullable=False),
        sa.Column("best_split", sa.Integer(), nullable=True),
        sa.Column("settled", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("sweep_id", sa.Integer(), nullable=True),
        sa.Column("created_at", gpumux.storage.models.UtcDateTime(), nullable=False),
        sa.Column("updated_at", gpumux.storage.models.UtcDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("profiles", schema=None) as batch_op:
        batch_op.create_index(
            "ix_profiles_device_name_fingerprint", ["device_name", "fingerprint"], unique=True
        )

    with op.batch_alter_table("trial_reports", schema=None) as batch_op:
        batch_op.create_index("ix_trial_reports_at", ["at"], unique=False)

    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.create_index("ix_trials_ended_at", ["ended_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.drop_index("ix_trials_ended_at")

    with op.batch_alter_table("trial_reports", schema=None) as batch_op:
        batch_op.drop_index("ix_trial_reports_at")

    with op.batch_alter_table("profiles", schema=None) as batch_op:
        batch_op.drop_index("ix_profiles_device_name_fingerprint")

    op.drop_table("profiles")
