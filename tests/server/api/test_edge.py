"""The HTTP edge: the body's size limit, bounded integers, OPTIONS and Allow, the schema's codes."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from builders import bearer, problem, served

from gpumux.config import MAX_BODY_BYTES, MIN_BODY_BYTES, Settings
from gpumux.fields import MAX_ID
from gpumux.server.api import create_app
from gpumux.server.api.shown import NAME_CHARS
from gpumux.storage.engine import Sessions

FIFTY_MB = 50 * 1024 * 1024
CHUNK = 64 * 1024
# A daemon that waited for a body never sent would never answer: the wait ends here, a failure.
NO_ANSWER_S = 30.0


def raw_answer(base_url: httpx.URL, head: bytes) -> httpx.Response:
    """What the daemon answers to a request's head alone, its declared body never sent."""
    with socket.create_connection((base_url.host, base_url.port), timeout=NO_ANSWER_S) as sock:
        sock.sendall(head)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += received(sock)
        lines, _, body = answer.partition(b"\r\n\r\n")
        status_line, *header_lines = lines.decode().split("\r\n")
        headers = dict(line.split(": ", 1) for line in header_lines)
        while len(body) < int(headers["content-length"]):
            body += received(sock)
    return httpx.Response(int(status_line.split()[1]), headers=headers, content=body)


def received(sock: socket.socket) -> bytes:
    """The next bytes of the answer; the connection closed before it was whole is a failure."""
    chunk = sock.recv(65536)
    assert chunk, "the daemon closed the connection before its answer was whole"
    return chunk


@pytest.mark.parametrize("path", ["/sweeps", "/reports"])
@pytest.mark.parametrize("with_token", [True, False])
def test_a_declared_50_mb_body_is_refused_413_before_a_byte_of_it_is_read(
    api: httpx.Client, path: str, with_token: bool
) -> None:
    token = api.headers["authorization"].encode() if with_token else b"Bearer not-a-token"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: gpumux\r\nContent-Type: application/json\r\n"
        f"Content-Length: {FIFTY_MB}\r\n".encode()
        + b"Authorization: "
        + token
        + b"\r\n\r\n"
    )

    detail = problem(raw_answer(api.base_url, head), 413).detail

    assert f"limit of {MAX_BODY_BYTES:,} bytes (GPUMUX_MAX_BODY_BYTES)" in detail
    assert api.get("/health").json()["status"] == "ok"


@pytest.mark.parametrize("path", ["/sweeps", "/reports"])
def test_a_50_mb_body_sent_whole_is_refused_from_its_declared_size_and_the_daemon_serves_on(
    api: httpx.Client, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    refused = api.post(path, content=b"x" * FIFTY_MB, headers={"content-type": "application/json"})
    problem(refused, 413)
    # Refused on its Content-Length, before the body was asked for: none of it was read.
    assert f"api: POST {path} refused: a body of {FIFTY_MB} bytes" in caplog.messages
    assert api.get("/sweeps").json()["count"] == 0


FORGED = "2026-01-01 00:00:00 CRITICAL gpumux: forged"


@pytest.mark.no_query
def test_a_path_that_decodes_to_a_line_break_cannot_forge_a_log_line(
    api: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    encoded = quote(f"\n{FORGED}")
    head = f"POST /x{encoded} HTTP/1.1\r\nHost: gpumux\r\nContent-Length: {FIFTY_MB}\r\n\r\n"
    problem(raw_answer(api.base_url, head.encode()), 413)
    assert api.delete(f"/tokens/a{encoded}").status_code == 200

    logged = [record.getMessage() for record in caplog.records]
    assert f"api: POST /x\\n{FORGED} refused: a body of {FIFTY_MB} bytes" in logged
    assert any(line.endswith(f"tokens of a\\n{FORGED}") for line in logged), logged
    assert not [line for line in logged if "\n" in line]


def chunks(size: int) -> Iterator[bytes]:
    """`size` bytes in pieces: httpx sends a generator chunked, without Content-Length."""
    for _ in range(size // CHUNK):
        yield b" " * CHUNK


@pytest.mark.parametrize("path", ["/sweeps", "/reports"])
@pytest.mark.parametrize("with_token", [True, False])
def test_a_chunked_body_is_counted_as_it_comes_and_refused_once_past_the_limit(
    api: httpx.Client, path: str, with_token: bool
) -> None:
    headers = {"content-type": "application/json"}
    if not with_token:
        headers["authorization"] = "Bearer not-a-token"
    refused = api.post(path, content=chunks(FIFTY_MB), headers=headers)
    assert "content-length" not in refused.request.headers
    problem(refused, 413)
    assert api.get("/health").json()["status"] == "ok"


def test_a_chunked_body_under_the_limit_is_read_as_any_other(
    api: httpx.Client, tmp_path: Path
) -> None:
    body = b'{"params": ["x=1,2"], "command": ["true"], "workdir": "%s"}' % str(tmp_path).encode()
    created = api.post(
        "/sweeps",
        content=iter([body[:10], body[10:]]),
        headers={"content-type": "application/json"},
    )
    assert created.status_code == 201, created.text
    assert created.json()["trial_count"] == 2


@pytest.mark.no_query
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/sweeps/{n}"),
        ("POST", "/sweeps/{n}/cancel"),
        ("GET", "/sweeps/{n}/trials"),
        ("GET", "/trials/{n}"),
        ("GET", "/trials/{n}/log"),
        ("GET", "/trials/{n}/reports"),
        ("GET", "/profiles/{n}"),
        ("GET", "/sweeps?offset={n}"),
        ("GET", "/profiles?offset={n}"),
        ("GET", "/trials/1/log?offset={n}"),
        ("GET", "/trials/1/reports?offset={n}"),
        ("GET", "/sweeps/1/trials?offset={n}"),
    ],
)
@pytest.mark.parametrize("number", [2**63, 10**100, -(2**64)])
def test_integers_beyond_64_bits_in_paths_and_queries_are_refused_422(
    api: httpx.Client, method: str, path: str, number: int
) -> None:
    refused = problem(api.request(method, path.format(n=number)), 422)
    (field,) = refused.errors
    assert field.loc[0] in ("path", "query")
    assert str(number) not in refused.model_dump_json()


def test_the_largest_id_is_a_plain_404(api: httpx.Client) -> None:
    # PostgreSQL's ids are BIGINT (migration 0009): as large as SQLite's rowid.
    for path in (f"/sweeps/{MAX_ID}", f"/trials/{MAX_ID}", f"/profiles/{MAX_ID}"):
        assert problem(api.get(path), 404).detail.endswith(f"{MAX_ID} not found")


@pytest.mark.no_query
def test_a_user_name_longer_than_any_stored_is_refused_422(api: httpx.Client) -> None:
    refused = problem(api.delete("/tokens/" + "a" * 1000), 422)
    assert refused.errors[0].loc == ["path", "user"]
    assert "a" * 100 not in refused.model_dump_json()
    refused = problem(api.get("/sweeps", params={"owner": "a" * 1000}), 422)
    assert refused.errors[0].loc == ["query", "owner"]


@pytest.mark.no_query
@pytest.mark.parametrize(
    ("path", "allow"),
    [
        ("/sweeps", "GET, HEAD, OPTIONS, POST"),
        ("/sweeps/3", "GET, HEAD, OPTIONS"),
        ("/sweeps/3/cancel", "OPTIONS, POST"),
        ("/reports", "OPTIONS, POST"),
        ("/tokens", "OPTIONS, POST"),
        ("/tokens/ada", "DELETE, OPTIONS"),
        ("/health", "GET, HEAD, OPTIONS"),
    ],
)
def test_options_and_405_carry_every_method_a_path_serves(
    api: httpx.Client, path: str, allow: str
) -> None:
    options = api.options(path)
    assert options.status_code == 204, options.text
    assert options.headers["allow"] == allow
    refused = api.request("PATCH", path)
    problem(refused, 405)
    assert refused.headers["allow"] == allow
    assert allow in refused.json()["detail"]


@pytest.mark.no_query
def test_a_405_names_a_method_of_any_length_in_a_few_characters(api: httpx.Client) -> None:
    refused = problem(api.request("M" * 10_000, "/sweeps"), 405)
    assert refused.detail.startswith(f"this path does not serve {'M' * NAME_CHARS}…; it serves")
    assert len(refused.detail) < 200


@pytest.mark.no_query
def test_options_on_no_route_is_a_404(api: httpx.Client) -> None:
    assert "allow" not in problem(api.options("/nothing/here"), 404).model_dump()
    assert problem(api.get("/nothing/here"), 404).detail.startswith("no route at this path")


def test_head_is_a_get_without_its_body(api: httpx.Client) -> None:
    got = api.get("/sweeps")
    head = api.head("/sweeps")
    assert head.status_code == 200
    assert head.content == b""
    assert head.headers["content-length"] == got.headers["content-length"]
    assert head.headers["content-type"] == got.headers["content-type"]


def operations(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            yield path, method, operation


# Routes anyone who reaches the daemon may call; every other route asks who the caller is.
OPEN = {("/health", "get"), ("/metrics", "get")}
# Routes for the other nodes: they ask which node it is (401), never whether a user may (403).
NODE_ONLY = {("/nodes/{node_id}/trials/{trial_id}/log", "get")}
PROBLEM = {"$ref": "#/components/schemas/Problem"}


@pytest.mark.no_query
def test_every_route_documents_its_error_answers_with_the_problem_body(
    api: httpx.Client,
) -> None:
    schema = api.get("/openapi.json").json()
    for path, method, operation in operations(schema):
        responses = operation["responses"]
        codes = {"413", "500"}
        if operation.get("parameters") or operation.get("requestBody"):
            codes.add("422")
        if (path, method) in NODE_ONLY:
            codes.add("401")
        elif (path, method) not in OPEN:
            codes |= {"401", "403"}
        assert codes <= set(responses), (method, path, sorted(responses))
        for code, response in responses.items():
            if int(code) >= 400:
                assert response["content"]["application/json"]["schema"] == PROBLEM, (path, code)
    assert "HTTPValidationError" not in schema["components"]["schemas"]


@pytest.mark.no_query
@pytest.mark.parametrize(
    ("path", "method", "codes"),
    [
        ("/sweeps", "post", {"429", "503", "507"}),
        ("/sweeps/{sweep_id}/cancel", "post", {"404", "503", "507"}),
        ("/reports", "post", {"404", "409", "503", "507"}),
        ("/tokens", "post", {"404", "503", "507"}),
        ("/trials/{trial_id}/log", "get", {"404"}),
    ],
)
def test_routes_document_the_refusals_of_their_own(
    api: httpx.Client, path: str, method: str, codes: set[str]
) -> None:
    responses = api.get("/openapi.json").json()["paths"][path][method]["responses"]
    assert codes <= set(responses)


@pytest.mark.no_query
def test_every_integer_in_a_path_or_query_is_bounded_in_the_schema(api: httpx.Client) -> None:
    schema = api.get("/openapi.json").json()
    for path, method, operation in operations(schema):
        for parameter in operation.get("parameters", []):
            types = [parameter["schema"], *parameter["schema"].get("anyOf", [])]
            for kind in types:
                if kind.get("type") == "integer":
                    assert "minimum" in kind and kind.get("maximum", 2**64) <= MAX_ID, (
                        method,
                        path,
                        parameter["name"],
                    )
                if kind.get("type") == "string" and parameter["in"] == "path":
                    assert "maxLength" in kind, (method, path, parameter["name"])


@pytest.mark.no_query
def test_the_limit_is_the_settings_own(settings: Settings, sessions: Sessions) -> None:
    app = create_app(
        settings=settings.model_copy(update={"max_body_bytes": MIN_BODY_BYTES}), sessions=sessions
    )
    with served(app, bearer(sessions)) as client:
        refused = client.post("/sweeps", content=b" " * (MIN_BODY_BYTES + 1))
        assert f"limit of {MIN_BODY_BYTES:,} bytes" in problem(refused, 413).detail
        at_the_limit = client.post("/sweeps", content=b" " * MIN_BODY_BYTES)
        assert at_the_limit.status_code == 422, at_the_limit.text
