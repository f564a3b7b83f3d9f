"""The request body's size limit, held before anything parses the body or looks at a token."""

from __future__ import annotations

import logging

from fastapi import HTTPException, status
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpumux.server.api.responses import problem_response
from gpumux.server.api.shown import shown, shown_path

log = logging.getLogger(__name__)


def too_large_detail(max_bytes: int) -> str:
    """What a client sending more than `max_bytes` is told, and what to do."""
    return (
        f"the request's body is over the daemon's limit of {max_bytes:,} bytes "
        "(GPUMUX_MAX_BODY_BYTES); it was refused unparsed and nothing was stored: send a "
        "smaller request"
    )


class BodyTooLarge(HTTPException):
    """A body without a (truthful) Content-Length that passed the limit while it was read."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(status.HTTP_413_CONTENT_TOO_LARGE, too_large_detail(max_bytes))


# Not FastAPI's own max_body_size: it holds a declared size only when something reads the body,
# so on a route that reads none only as the answer starts, after the route (its token check
# included) has run; and it answers in plain text, not in the Problem shape.
class BodyLimit:
    """Pure ASGI middleware: 413 for a declared Content-Length over `max_bytes`, none of it
    read; a body sent chunked (or longer than declared) is counted as it arrives and refused
    once past it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            log.warning(
                "api: %s %s refused: a body of %d bytes",
                shown(scope["method"]),
                shown_path(scope),
                declared,
            )
            response = problem_response(
                status.HTTP_413_CONTENT_TOO_LARGE, too_large_detail(self.max_bytes)
            )
            await response(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # An HTTPException: FastAPI passes it on from its body reader to the error
                    # handlers, where any other exception would become a 400.
                    log.warning(
                        "api: %s %s refused: a body past the limit",
                        shown(scope["method"]),
                        shown_path(scope),
                    )
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, counted, send)


def _content_length(scope: Scope) -> int | None:
    """The declared body size; None without one (the server refuses one that is not a number)."""
    value = Headers(scope=scope).get("content-length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
