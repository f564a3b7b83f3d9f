"""profiles keep the workload's directory apart from its command

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

profiles = sa.table(
    "profiles",
    sa.column("id", sa.BigInteger()),
    sa.column("workdir", sa.Text()),
    sa.column("command", sa.JSON()),
)


def upgrade() -> None:
    with op.batch_alter_table("profiles", schema=None) as batch_op:
        batch_op.add_column(sa.Column("workdir", sa.Text(), nullable=True))
    # The split search stored [directory, *command] as a profile's command: the directory, an
    # absolute path (sweeps refuse any other), moves to its own column.
    connection = op.get_bind()
    for row in connection.execute(sa.select(profiles.c.id, profiles.c.command)).all():
        command = list(row.command or [])
        if len(command) > 1 and command[0].startswith("/"):
            connection.execute(
                profiles.update()
                .where(profiles.c.id == row.id)
                .values(workdir=command[0], command=command[1:])
            )


def downgrade() -> None:
    # An older gpumux keys profiles on [directory, *command] in one column again.
    connection = op.get_bind()
    rows = connection.execute(
        sa.select(profiles.c.id, profiles.c.workdir, profiles.c.command).where(
            profiles.c.workdir.is_not(None)
        )
    ).all()
    for row in rows:
        connection.execute(
            profiles.update()
            .where(profiles.c.id == row.id)
            .values(command=[row.workdir, *(row.command or [])])
        )
    with op.batch_alter_table("profiles", schema=None) as batch_op:
        batch_op.drop_column("workdir")
