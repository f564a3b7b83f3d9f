"""warm starts: a sweep's trials may start from the warm spawner

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("warm", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    # An older gpumux starts every trial cold: the sweeps run on, only slower to start.
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.drop_column("warm")
