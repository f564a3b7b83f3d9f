"""profile context: the CUDA context a workload's trials showed on a device model

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("profiles", schema=None) as batch_op:
        batch_op.add_column(sa.Column("context_mb", sa.Integer(), nullable=True))


def downgrade() -> None:
    # An older gpumux budgets its configured overhead until a trial passes its slice.
    with op.batch_alter_table("profiles", schema=None) as batch_op:
        batch_op.drop_column("context_mb")
