"""profile limits: the N that ran out of memory and a lowered ceiling, per profile

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("profiles", schema=None) as batch_op:
        batch_op.add_column(sa.Column("oom_at", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("ceiling", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("profiles", schema=None) as batch_op:
        batch_op.drop_column("ceiling")
        batch_op.drop_column("oom_at")
