"""reports dropped: how many of a trial's reports went over its budget

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "reports_dropped",
                sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                nullable=False,
                server_default="0",
            )
        )


def downgrade() -> None:
    # An older gpumux stores every report again; the count of those dropped is forgotten.
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.drop_column("reports_dropped")
