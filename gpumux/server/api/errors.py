"""Every error answer in one shape (schemas.common.Problem): refusals, refused fields, unknown
routes, database failures (a full disk, a lock held too long, a server out of reach) and the
daemon's own bugs."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import exc
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpumux.schemas.common import FieldProblem
from gpumux.server.api.allow import NO_ROUTE, allow_header
from gpumux.server.api.deps import get_state
from gpumux.server.api.responses import problem_response
from gpumux.server.api.shown import shown, shown_path

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5
# Fields named in a 422's one-line detail, and listed in its `errors`: a hostile body can hold
# one mistake per byte, and the answer must not grow with it.
NAMED_IN_DETAIL = 3
LISTED = 50
# A field's message as an answer shows it: validators quote what they refuse, each bounded, and
# this bounds whatever one may quote still.
MSG_CHARS = 500


def install(app: FastAPI) -> None:
    """Answer every error in the Problem shape: handlers for what routes raise, a last resort
    for anything else."""
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(exc.SQLAlchemyError, database_error)
    app.add_middleware(LastResort)


def where(scope: Scope) -> str:
    """The method and the route (its template, so no value of the request) a scope asked for."""
    route = scope.get("route")
    return f"{shown(scope['method'])} {getattr(route, 'path', None) or shown_path(scope)}"


async def http_error(request: Request, error: Exception) -> JSONResponse:
    """A refusal raised as HTTPException (by a route, or by the router for no route)."""
    assert isinstance(error, HTTPException)
    headers = dict(error.headers or {})
    detail = str(error.detail)
    bare = detail == HTTPStatus(error.status_code).phrase
    if error.status_code == status.HTTP_400_BAD_REQUEST and isinstance(
        error.__cause__, ValueError | RecursionError
    ):
        # FastAPI's body reader: json.loads failed other than by a JSON syntax error.
        return not_json(error.__cause__)
    if error.status_code == status.HTTP_405_METHOD_NOT_ALLOWED:
        headers.update(allow_header(request.app.router, request.scope))
        if bare:
            detail = (
                f"this path does not serve {shown(request.method)}; it serves {headers['Allow']}"
            )
    elif error.status_code == status.HTTP_404_NOT_FOUND and bare:
        detail = NO_ROUTE
    return problem_response(error.status_code, detail, headers=headers)


def not_json(cause: ValueError | RecursionError) -> JSONResponse:
    """422 for a body that is not JSON at all: not UTF-8, or nested past the parser's depth."""
    reason = (
        "it is not UTF-8 text"
        if isinstance(cause, UnicodeDecodeError)
        else "it is nested too deeply"
        if isinstance(cause, RecursionError)
        else "it cannot be decoded"
    )
    problem = FieldProblem(loc=["body"], msg=f"not valid JSON: {reason}", type="json_invalid")
    return problem_response(
        status.HTTP_422_UNPROCESSABLE_CONTENT, f"1 field refused: body: {problem.msg}", [problem]
    )


def field_problem(error: dict[str, Any]) -> FieldProblem:
    """One of pydantic's errors without its `input` and `ctx`, which may hold the value; the
    names in its `loc` (dict keys, unknown fields: the client's) and its message bounded."""
    loc = [part if isinstance(part, int) else shown(str(part)) for part in error["loc"]]
    msg = shown(str(error["msg"]).removeprefix("Value error, "), MSG_CHARS)
    if error["type"] == "json_invalid":
        # FastAPI's loc is ("body", character position); the reason is in ctx, value-free.
        position = f" at character {loc[1]}" if len(loc) > 1 else ""
        reason = str((error.get("ctx") or {}).get("error", "cannot be parsed"))
        loc, msg = ["body"], f"not valid JSON: {reason}{position}"
    return FieldProblem(loc=loc, msg=msg, type=str(error["type"]))


async def validation_error(request: Request, error: Exception) -> JSONResponse:
    """422 naming each refused field, in the Problem shape, never echoing what was sent."""
    assert isinstance(error, RequestValidationError)
    problems = [field_problem(item) for item in error.errors()]
    named = "; ".join(
        f"{'.'.join(str(part) for part in problem.loc)}: {problem.msg}"
        for problem in problems[:NAMED_IN_DETAIL]
    )
    more = len(problems) - NAMED_IN_DETAIL
    count = len(problems)
    detail = f"{count} field{'s' if count != 1 else ''} refused: {named}" + (
        f"; and {more} more" if more > 0 else ""
    )
    return problem_response(status.HTTP_422_UNPROCESSABLE_CONTENT, detail, problems[:LISTED])


async def database_error(request: Request, error: Exception) -> JSONResponse:
    """The answer to a database error raised by a route; its transaction has rolled back."""
    dialect = get_state(request).sessions.dialect
    database = dialect.label
    route = where(request.scope)
    cause = error.orig if isinstance(error, exc.DBAPIError) else error
    if dialect.is_full(error):
        log.error("db %s: full; %s refused: %s", database, route, cause)
        return problem_response(
            status.HTTP_507_INSUFFICIENT_STORAGE,
            f"the database {database} is full: its disk has no space left (or it reached its "
            "size limit); nothing of this request was stored. Free space on that disk, then "
            "try again",
        )
    if dialect.is_busy(error):
        # Each connection waits busy_timeout_s for the write lock first: held that long, it is
        # held outside the daemon (a tool with a transaction left open, say).
        log.warning("db %s: locked; %s refused: %s", database, route, cause)
        return problem_response(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"the database {database} is locked by another writer (waited up to "
            f"{dialect.busy_timeout_s:g} s); nothing of this request was stored. Try again "
            "shortly",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    if dialect.is_unreachable(error):
        reason = first_line(cause or error)
        log.warning("db %s: unreachable; %s refused: %s", database, route, reason)
        return unreachable(database, reason)
    # The driver's message goes to the log only: it is the daemon's internals (LastResort).
    log.error("db %s: %s failed", database, route, exc_info=error)
    return problem_response(
        status.HTTP_500_INTERNAL_SERVER_ERROR,
        f"the database {database} failed to answer {route}: its error is in the daemon's log; "
        "try again, and report it if it happens again",
    )


def first_line(error: BaseException) -> str:
    """The first line of an error's message (a driver's goes on with hints), else its type."""
    return (str(error).splitlines() or [type(error).__name__])[0]


def unreachable(database: str, reason: str) -> JSONResponse:
    """503 with Retry-After: the database's server cannot be reached (down, restarting, or out
    of this node's reach), a state the daemon waits out rather than a defect."""
    return problem_response(
        status.HTTP_503_SERVICE_UNAVAILABLE,
        f"the database {database} is unreachable ({reason}); the daemon retries on its own: "
        "check that the server runs and that this node reaches it",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


class LastResort:
    """Pure ASGI middleware: an exception no handler answered is logged with its traceback and
    answered 500 in the Problem shape, with nothing of the daemon's internals."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception:
            log.exception("api: %s %s failed", shown(scope["method"]), shown_path(scope))
            if started:
                # Half an answer is out: the server can only close the connection.
                raise
            response = problem_response(
                status.HTTP_500_INTERNAL_SERVER_ERROR,
                f"the daemon failed to answer {where(scope)}: its log has the traceback; try "
                "again, and report it if it happens again",
            )
            await response(scope, receive, send)
