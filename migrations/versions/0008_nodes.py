"""nodes: the daemons that share one database, their leases, and the node each trial is on

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(length=255), nullable=False, unique=True),
        sa.Column("home_id", sa.String(length=36), nullable=False),
        sa.Column("incarnation", sa.Integer(), nullable=False),
        sa.Column(
            "state",
            sa.Enum("active", "left", "lost", name="nodestate", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column("url", sa.Text(), nullable=True),
        sa.Column("token_hash", sa.String(length=64), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("devices", sa.JSON(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=False),
        sa.Column("lease_until", sa.DateTime(), nullable=False),
    )
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.add_column(sa.Column("node_id", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(
            "fk_trials_node_id_nodes", "nodes", ["node_id"], ["id"], ondelete="SET NULL"
        )
        batch_op.create_index("ix_trials_node_id_status", ["node_id", "status"])


def downgrade() -> None:
    # An older gpumux runs one daemon on the database: which node held a trial is forgotten.
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.drop_index("ix_trials_node_id_status")
        batch_op.drop_constraint("fk_trials_node_id_nodes", type_="foreignkey")
        batch_op.drop_column("node_id")
    op.drop_table("nodes")
