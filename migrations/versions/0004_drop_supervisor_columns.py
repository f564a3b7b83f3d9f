"""drop trials.supervisor_pid and supervisor_started: the run directory keeps the supervisor

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.drop_column("supervisor_started")
        batch_op.drop_column("supervisor_pid")


def downgrade() -> None:
    # The values are gone: an older gpumux reads its supervisors from their run directories.
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.add_column(sa.Column("supervisor_pid", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("supervisor_started", sa.Integer(), nullable=True))
