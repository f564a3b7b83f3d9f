"""Alembic environment: runs migrations on the engine gpumux hands over (its dialect's setup
included), in one transaction that the dialect opens."""

from __future__ import annotations

from alembic import context

from gpumux.config import Settings
from gpumux.storage.dialects import dialect_for
from gpumux.storage.engine import make_engine
from gpumux.storage.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    """Migrate over gpumux's engine, or over the configured database when run by `alembic`."""
    engine = config.attributes.get("engine") or make_engine(Settings().database_url)
    with engine.connect() as connection, dialect_for(engine.url).migrating(connection):
        # SQLite alters tables by copying them: batch mode does that for us.
        context.configure(
            connection=connection, target_metadata=target_metadata, render_as_batch=True
        )
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("gpumux migrations run online only: gpumux serve applies them at start")
run_migrations_online()
