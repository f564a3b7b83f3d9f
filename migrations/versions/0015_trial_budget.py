"""trial budget: sweeps.random_trials renamed for what it holds, --trials whatever the method

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A random search's draws and an adaptive search's budget alike; None for a grid.
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.alter_column("random_trials", new_column_name="trial_budget")


def downgrade() -> None:
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.alter_column("trial_budget", new_column_name="random_trials")
