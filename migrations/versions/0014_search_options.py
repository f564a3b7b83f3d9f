"""search options: the sampler's options a sweep set (--search tpe:n_startup_trials=4)

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("search_options", sa.JSON(), nullable=True))


def downgrade() -> None:
    # An older gpumux rebuilds such a sweep's sampler with its own options.
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.drop_column("search_options")
