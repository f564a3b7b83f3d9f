"""Database failures as clear HTTP answers: a full disk, a lock held too long, anything else."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request, status
from fastapi.responses import JSONResponse
from sqlalchemy import exc

from gpumux.server.api.deps import get_state

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5


def install(app: FastAPI) -> None:
    """Answer the database errors that reach the routes: 507 full, 503 locked, 500 otherwise."""
    app.add_exception_handler(exc.SQLAlchemyError, database_error)


async def database_error(request: Request, error: Exception) -> JSONResponse:
    """The answer to a database error raised by a route; its transaction has rolled back."""
    dialect = get_state(request).sessions.dialect
    database = dialect.label
    where = f"{request.method} {request.url.path}"
    cause = error.orig if isinstance(error, exc.DBAPIError) else error
    if dialect.is_full(error):
        log.error("db %s: full; %s refused: %s", database, where, cause)
        return JSONResponse(
            {
                "detail": f"the database {database} is full: its disk has no space left (or "
                "it reached its size limit); nothing of this request was stored. Free space "
                "on that disk, then try again"
            },
            status_code=status.HTTP_507_INSUFFICIENT_STORAGE,
        )
    if dialect.is_busy(error):
        # Each connection waits busy_timeout_s for the write lock first: held that long, it is
        # held outside the daemon (a tool with a transaction left open, say).
        log.warning("db %s: locked; %s refused: %s", database, where, cause)
        return JSONResponse(
            {
                "detail": f"the database {database} is locked by another writer (waited up to "
                f"{dialect.busy_timeout_s:g} s); nothing of this request was stored. Try "
                "again shortly"
            },
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    log.error("db %s: %s failed", database, where, exc_info=error)
    summary = (str(cause).splitlines() or [""])[0]
    return JSONResponse(
        {
            "detail": f"database error in {where}: {type(cause).__name__}: {summary} "
            "(the daemon's log has the details)"
        },
        status_code=status.HTTP_500_INTERNAL_SERVER_ERROR,
    )
