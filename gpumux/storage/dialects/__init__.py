"""The kinds of database gpumux can keep its state in, and the one a URL names.

A new kind is one module here with a Dialect subclass, added to DIALECTS.
"""

from __future__ import annotations

from sqlalchemy import URL, make_url
from sqlalchemy.exc import ArgumentError

from gpumux.storage.dialects.base import DatabaseError, Dialect
from gpumux.storage.dialects.postgresql import PostgresqlDialect
from gpumux.storage.dialects.sqlite import SqliteDialect

DIALECTS: tuple[type[Dialect], ...] = (SqliteDialect, PostgresqlDialect)


def dialect_for(url: str | URL) -> Dialect:
    """The dialect of a database URL; DatabaseError naming the supported ones if none fits."""
    supported = ", ".join(dialect.example_url for dialect in DIALECTS)
    try:
        parsed = make_url(url)
    except ArgumentError:
        # Not echoed: a malformed URL may still hold a password.
        raise DatabaseError(
            f"the database URL is not one SQLAlchemy can read; gpumux supports {supported} "
            "(GPUMUX_DATABASE_URL, or GPUMUX_DB for an SQLite file)"
        ) from None
    for dialect in DIALECTS:
        if parsed.drivername in dialect.drivernames:
            return dialect(parsed)
    raise DatabaseError(
        f"database URL {parsed.render_as_string(hide_password=True)}: gpumux has no dialect "
        f"for {parsed.drivername}; it supports {supported} (GPUMUX_DATABASE_URL, or GPUMUX_DB "
        "for an SQLite file)"
    )
