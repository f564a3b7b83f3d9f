"""wide integers on PostgreSQL: ids, uids, seeds, start ticks and log offsets as BIGINT

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# Every column that may outgrow PostgreSQL's INTEGER (SQLite's is 64-bit: nothing to do there).
COLUMNS = {
    "owners": ["id", "uid"],
    "api_tokens": ["id", "owner_id"],
    "sweeps": ["id", "owner_id", "seed"],
    "nodes": ["id"],
    "trials": ["id", "sweep_id", "node_id", "pid_started", "log_scanned"],
    "trial_reports": ["id", "trial_id"],
    "profiles": ["id", "sweep_id"],
}
# The tables whose id a sequence numbers.
NUMBERED = ["owners", "api_tokens", "sweeps", "nodes", "trials", "trial_reports", "profiles"]


def _widen(to: sa.types.TypeEngine[int], sequence_type: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, columns in COLUMNS.items():
        with op.batch_alter_table(table) as batch_op:
            for column in columns:
                batch_op.alter_column(column, type_=to)
    for table in NUMBERED:
        op.execute(f"ALTER SEQUENCE {table}_id_seq AS {sequence_type}")


def upgrade() -> None:
    _widen(sa.BigInteger(), "bigint")


def downgrade() -> None:
    # Refused by PostgreSQL where a value no longer fits: an older gpumux cannot hold it.
    _widen(sa.Integer(), "integer")
