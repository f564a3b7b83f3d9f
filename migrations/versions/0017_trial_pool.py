"""trial pool: the device memory a trial's framework last said it holds in its pool, and when

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import gpumux.storage.models

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.add_column(sa.Column("pool_mb", sa.Integer(), nullable=True))
        batch_op.add_column(
            sa.Column("pool_at", gpumux.storage.models.UtcDateTime(), nullable=True)
        )


def downgrade() -> None:
    # An older gpumux drops the pool its trials tell, and measures no CUDA context.
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.drop_column("pool_at")
        batch_op.drop_column("pool_mb")
