"""optimizer steps: reports carry the steps the runtime counted, trials their steps/s

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trial_reports", schema=None) as batch_op:
        batch_op.add_column(sa.Column("steps", sa.Double(), nullable=True))
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.add_column(sa.Column("steps_per_s", sa.Double(), nullable=True))


def downgrade() -> None:
    # An older gpumux measures PyTorch scripts that report no samples by finished trials again.
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.drop_column("steps_per_s")
    with op.batch_alter_table("trial_reports", schema=None) as batch_op:
        batch_op.drop_column("steps")
