"""no GPU seen: the framework that saw no GPU on the GPU a trial was placed on

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.add_column(sa.Column("no_gpu", sa.String(length=16), nullable=True))


def downgrade() -> None:
    # An older gpumux measures a CPU-only framework's trials on a GPU as the GPU's again.
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.drop_column("no_gpu")
