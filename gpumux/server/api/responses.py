"""The API's error answers: the one Problem body each is sent with, and its OpenAPI entries."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi.responses import JSONResponse

from gpumux.schemas.common import FieldProblem, Problem

# What each error status means in this API, as the schema tells clients. No route lists 405: it
# answers a method that no route at the path serves (its Allow header names those that do).
MEANINGS = {
    401: "No token, or one that is unknown or revoked (over TCP)",
    403: "The caller may not do this (another user's work, a user the daemon does not serve)",
    404: "Nothing with that id, or no such route",
    409: "The request conflicts with the current state (a report for an attempt that ended)",
    413: "The request's body is over the daemon's limit (GPUMUX_MAX_BODY_BYTES); refused unparsed",
    422: "A field of the request is refused: `errors` names each one",
    429: "The caller has too many trials waiting (GPUMUX_MAX_QUEUED_PER_USER)",
    500: "A failure of the daemon; its log has the details",
    502: "The node that holds the trial did not answer, or refused this node",
    503: "The database is busy (locked by another writer) or cannot be read: try again; or the "
    "node that holds the trial cannot be asked (no TCP, its lease lost)",
    507: "The database's disk is full; nothing of the request was stored",
}
# Every route can be sent a body over the limit, and can fail.
EVERY_ROUTE = (413, 500)
# Routes that ask who the caller is (CallerDep): over TCP that takes a token.
AUTHENTICATED = (401, 403)
# Routes that write to the database.
WRITES = (503, 507)


def problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries for these error statuses, each with the Problem body."""
    return {code: {"model": Problem, "description": MEANINGS[code]} for code in codes}


def problem_response(
    status_code: int,
    detail: str,
    errors: Sequence[FieldProblem] = (),
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """An error answer in the one shape: `detail` on one line, and the fields at fault."""
    body = Problem(detail=" ".join(detail.splitlines()), errors=list(errors))
    return JSONResponse(body.model_dump(mode="json"), status_code=status_code, headers=headers)
