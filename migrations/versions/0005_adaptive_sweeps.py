"""adaptive sweeps: search method and pruner per sweep, steps in reports, Optuna state

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# A trial's status is a VARCHAR(16) without a CHECK constraint: "pruned" needs no schema change.


def upgrade() -> None:
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "search",
                sa.Enum(
                    "grid",
                    "random",
                    "tpe",
                    "gp",
                    "cmaes",
                    "qmc",
                    name="searchmethod",
                    native_enum=False,
                    length=16,
                ),
                nullable=False,
                server_default="grid",
            )
        )
        batch_op.add_column(sa.Column("prune", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("study_attrs", sa.JSON(), nullable=True))
    op.execute("UPDATE sweeps SET search = 'random' WHERE random_trials IS NOT NULL")
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.add_column(sa.Column("step", sa.Integer(), nullable=True))
        batch_op.add_column(
            sa.Column("log_scanned", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(sa.Column("optuna_attrs", sa.JSON(), nullable=True))
    with op.batch_alter_table("trial_reports", schema=None) as batch_op:
        batch_op.alter_column("epoch", new_column_name="step", existing_type=sa.Integer())
    # The Keras hook counted epochs from 1, and gave a batch report its epoch; a step counts
    # from 0 and belongs to the report that ends it.
    op.execute("UPDATE trial_reports SET step = step - 1 WHERE kind = 'epoch' AND step > 0")
    op.execute("UPDATE trial_reports SET step = NULL WHERE kind = 'batch'")


def downgrade() -> None:
    # Pruned trials become failed ones: an older gpumux has no such status; an adaptive
    # sweep ends with the trials it asked, which is all an older gpumux can run.
    op.execute("UPDATE trials SET status = 'failed' WHERE status = 'pruned'")
    op.execute(
        "UPDATE sweeps SET trial_count = "
        "(SELECT count(*) FROM trials WHERE trials.sweep_id = sweeps.id) "
        "WHERE search NOT IN ('grid', 'random')"
    )
    op.execute("UPDATE trial_reports SET step = step + 1 WHERE kind = 'epoch'")
    with op.batch_alter_table("trial_reports", schema=None) as batch_op:
        batch_op.alter_column("step", new_column_name="epoch", existing_type=sa.Integer())
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.drop_column("optuna_attrs")
        batch_op.drop_column("log_scanned")
        batch_op.drop_column("step")
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.drop_column("study_attrs")
        batch_op.drop_column("prune")
        batch_op.drop_column("search")
