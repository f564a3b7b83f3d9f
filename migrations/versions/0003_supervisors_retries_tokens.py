"""per-trial supervisors, retries, sweep priority, API tokens

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import gpumux.storage.models

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", gpumux.storage.models.UtcDateTime(), nullable=False),
        sa.Column("last_used_at", gpumux.storage.models.UtcDateTime(), nullable=True),
        sa.Column("revoked_at", gpumux.storage.models.UtcDateTime(), nullable=True),
        sa.ForeignKeyConstraint(["owner_id"], ["owners.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
    )
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("retries", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("priority", sa.Integer(), server_default="0", nullable=False))
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.add_column(sa.Column("supervisor_pid", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("supervisor_started", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("failures", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.drop_column("failures")
        batch_op.drop_column("supervisor_started")
        batch_op.drop_column("supervisor_pid")
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.drop_column("priority")
        batch_op.drop_column("retries")
    op.drop_table("api_tokens")
