"""Alembic environment: runs migrations on the engine gpumux hands over (its dialect's setup
included), in one transaction that the dialect opens."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from gpumux.config import Settings
from gpumux.storage.dialects import dialect_for
from gpumux.storage.engine import make_engine
from gpumux.storage.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    """Migrate on the connection gpumux hands over (it holds the migration lock), or else on
    a connection of its own (run by `alembic`, or by a test) that takes the lock first."""
    connection = config.attributes.get("connection")
    if connection is not None:
        migrate(connection)
        return
    engine = config.attributes.get("engine") or make_engine(Settings().database_url)
    with engine.connect() as own, dialect_for(engine.url).migration_lock(own):
        migrate(own)


def migrate(connection: Connection) -> None:
    """Run the migrations in the one transaction the dialect opens."""
    with dialect_for(connection.engine.url).migrating(connection):
        # SQLite alters tables by copying them: batch mode does that for us.
        context.configure(
            connection=connection, target_metadata=target_metadata, render_as_batch=True
        )
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("gpumux migrations run online only: gpumux serve applies them at start")
run_migrations_online()
