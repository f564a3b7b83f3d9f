"""preload: a sweep's `warm` column renamed `preload`, as the CLI's --preload and the API's field

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.alter_column("warm", new_column_name="preload")


def downgrade() -> None:
    # An older gpumux reads the same flag under its old name.
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.alter_column("preload", new_column_name="warm")
