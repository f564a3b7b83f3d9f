"""Which methods each path serves: OPTIONS and HEAD answered for every route, and `Allow`."""

from __future__ import annotations

from starlette.routing import Match, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpumux.server.api.responses import problem_response

# The methods a route may serve; HEAD and OPTIONS are answered here for every route.
ROUTED = ("DELETE", "GET", "PATCH", "POST", "PUT")
NO_ROUTE = "no route at this path: /docs lists the API's routes"


def allowed_methods(router: Router, scope: Scope) -> list[str]:
    """Every method some route serves at the scope's path (none: no route there), sorted."""
    methods = {
        method
        for method in ROUTED
        if any(
            route.matches({**scope, "type": "http", "method": method})[0] is Match.FULL
            for route in router.routes
        )
    }
    if methods:
        methods.add("OPTIONS")
        if "GET" in methods:
            methods.add("HEAD")
    return sorted(methods)


def allow_header(router: Router, scope: Scope) -> dict[str, str]:
    """The `Allow` header of the scope's path."""
    return {"Allow": ", ".join(allowed_methods(router, scope))}


class Methods:
    """Pure ASGI middleware: OPTIONS answers 204 with `Allow` on every path a route serves, and
    HEAD is a GET without its body; anything else goes on to `router`'s app unchanged."""

    def __init__(self, app: ASGIApp, router: Router) -> None:
        self.app = app
        self.router = router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"] if scope["type"] == "http" else None
        if method == "OPTIONS":
            await self._options(scope, receive, send)
        elif method == "HEAD" and "GET" in allowed_methods(self.router, scope):
            await self.app({**scope, "method": "GET"}, receive, _without_body(send))
        else:
            await self.app(scope, receive, send)

    async def _options(self, scope: Scope, receive: Receive, send: Send) -> None:
        allow = allow_header(self.router, scope)
        if allow["Allow"]:
            await send({"type": "http.response.start", "status": 204, "headers": _raw(allow)})
            await send({"type": "http.response.body", "body": b""})
        else:
            response = problem_response(404, NO_ROUTE)
            await response(scope, receive, send)


def _without_body(send: Send) -> Send:
    """`send` with the body of the response dropped (its headers, Content-Length too, kept)."""

    async def headers_only(message: Message) -> None:
        if message["type"] == "http.response.body":
            message = {**message, "body": b""}
        await send(message)

    return headers_only


def _raw(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(name.lower().encode(), value.encode()) for name, value in headers.items()]
