"""The web dashboard: a static page (gpumux/server/web) that reads the REST API from the browser."""

from __future__ import annotations

from importlib import resources
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Request, Response, status
from fastapi.responses import RedirectResponse

router = APIRouter(tags=["ui"], include_in_schema=False)

JAVASCRIPT = "text/javascript; charset=utf-8"
# The page's own files, nothing else: a name not listed here is a 404, never a path on disk.
# The scripts are ES modules that import one another: no bundler, no build step.
ASSETS = {
    "style.css": "text/css; charset=utf-8",
    "app.js": JAVASCRIPT,
    "api.js": JAVASCRIPT,
    "dom.js": JAVASCRIPT,
    "chart.js": JAVASCRIPT,
    "overview.js": JAVASCRIPT,
    "sweep.js": JAVASCRIPT,
    "trial.js": JAVASCRIPT,
    "profiles.js": JAVASCRIPT,
}
NAME_MAX = max(len(name) for name in ASSETS)
# The page loads only its own files and talks only to this daemon; the data it shows (logs,
# parameters) is put into the DOM as text, and this keeps even a mistake from running code.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": CSP,
    "Referrer-Policy": "no-referrer",
}


def web_file(name: str) -> bytes:
    """One file of the dashboard, from the installed package."""
    return resources.files("gpumux.server").joinpath("web", name).read_bytes()


def to_page(request: Request) -> RedirectResponse:
    """A redirect to the page that keeps the query (?token=...)."""
    # Relative, so that it also works behind a proxy that serves the daemon under a prefix.
    query = request.url.query
    location = f"ui/?{query}" if query else "ui/"
    return RedirectResponse(location, status_code=status.HTTP_307_TEMPORARY_REDIRECT)


@router.get("/")
def root(request: Request) -> RedirectResponse:
    """The dashboard is the daemon's home page."""
    return to_page(request)


@router.get("/ui")
def ui_without_slash(request: Request) -> RedirectResponse:
    """The page's relative links need the trailing slash."""
    return to_page(request)


@router.get("/ui/")
def index() -> Response:
    """The dashboard page."""
    return Response(web_file("index.html"), media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/ui/static/{name}")
def asset(name: Annotated[str, Path(max_length=NAME_MAX)]) -> Response:
    """The dashboard's scripts and style sheet."""
    media_type = ASSETS.get(name)
    if media_type is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, "no such dashboard file: /ui/ is the dashboard"
        )
    return Response(web_file(name), media_type=media_type, headers=HEADERS)
