"""The HTTP client against a real daemon (embedded, on a real socket)."""

from __future__ import annotations

import os
import ssl
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ports import free_port

from gpumux import client as client_module
from gpumux.client import (
    ApiError,
    Client,
    DaemonUnreachable,
    InvalidDaemonUrl,
    InvalidToken,
    error_detail,
)
from gpumux.config import Settings
from gpumux.home import tokenfile
from gpumux.schemas.common import FieldProblem, Problem
from gpumux.schemas.sweeps import SweepCreate, SweepDetail
from gpumux.server.daemon import embedded
from gpumux.status import SweepStatus, TrialStatus

FIXTURES = Path(__file__).parent / "fixtures"
MAX_GRID = 50


def wait_ended(client: Client, sweep_id: int) -> SweepDetail:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        sweep = client.get_sweep(sweep_id)
        if sweep.status in (SweepStatus.finished, SweepStatus.cancelled):
            return sweep
        time.sleep(0.05)
    raise AssertionError(f"sweep {sweep_id} did not end within 60 s")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str | None]]:
    """The URL of a daemon over TCP, and the token it keeps for its own user."""
    home = tmp_path_factory.mktemp("client") / "home"
    url = f"http://127.0.0.1:{free_port()}"
    settings = Settings(home=home, url=url, max_grid=MAX_GRID, poll_interval=0.2)
    with embedded(settings) as running:
        yield running.url, tokenfile.daemon_token(home)


@pytest.fixture
def client(daemon: tuple[str, str | None]) -> Iterator[Client]:
    url, token = daemon
    with Client(url, timeout=10, token=token) as api:
        yield api


def echo_sweep(tmp_path: Path, *params: str) -> SweepCreate:
    return SweepCreate(
        params=list(params),
        command=[sys.executable, str(FIXTURES / "echo_params.py")],
        workdir=str(tmp_path),
        env=dict(os.environ),
        split=2,
    )


def test_health_names_the_database(client: Client) -> None:
    health = client.health()
    assert health.status == "ok"
    assert health.database.endswith("gpumux.db")
    assert health.devices >= 1


def test_a_sweep_round_trips_through_every_read(client: Client, tmp_path: Path) -> None:
    created = client.create_sweep(echo_sweep(tmp_path, "x=1,2", "mode=fast"))
    assert created.trial_count == 2
    sweep = wait_ended(client, created.id)
    assert sweep.counts == {TrialStatus.succeeded: 2}
    assert created.id in [s.id for s in client.list_sweeps(status=SweepStatus.finished).data]
    trials = client.list_trials(created.id).data
    assert [t.params for t in trials] == [{"x": 1, "mode": "fast"}, {"x": 2, "mode": "fast"}]
    assert client.get_trial(trials[1].id).status == TrialStatus.succeeded
    log = client.get_log(trials[1].id, 0)
    assert log.complete
    assert 'argv: ["--x=2", "--mode=fast"]' in log.data
    assert client.list_reports(trials[1].id).count == 0
    assert [device.key for device in client.devices()] == ["cpu"]


def test_all_trials_pages_through_a_sweep(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    created = client.create_sweep(echo_sweep(tmp_path, "x=1,2,3"))
    monkeypatch.setattr(client_module, "TRIALS_PAGE", 2)
    assert [trial.params["x"] for trial in client.all_trials(created.id)] == [1, 2, 3]
    wait_ended(client, created.id)


def test_an_unknown_id_is_an_api_error_with_the_daemons_message(client: Client) -> None:
    with pytest.raises(ApiError) as raised:
        client.get_sweep(999_999)
    assert raised.value.status_code == 404
    assert str(raised.value) == "sweep 999999 not found"
    with pytest.raises(ApiError, match=r"^trial 999999 not found$"):
        client.get_log(999_999)


def test_validation_errors_become_field_lines(client: Client) -> None:
    with pytest.raises(ApiError) as raised:
        client.list_sweeps(limit=0)
    assert raised.value.status_code == 422
    assert str(raised.value).startswith("limit: ")
    assert "greater than or equal to 1" in str(raised.value)


def test_the_daemon_refuses_a_grid_over_its_limit(client: Client, tmp_path: Path) -> None:
    before = client.list_sweeps().count
    with pytest.raises(ApiError) as raised:
        client.create_sweep(echo_sweep(tmp_path, "x=1..100"))
    assert raised.value.status_code == 422
    assert f"the grid has 100 trials, over the limit of {MAX_GRID}" in str(raised.value)
    assert client.list_sweeps().count == before


def test_no_daemon_on_a_port_is_daemon_unreachable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with Client(url, timeout=5) as api, pytest.raises(DaemonUnreachable) as raised:
        api.health()
    assert raised.value.url == url
    assert str(raised.value).startswith(f"no gpumux daemon answers at {url}")


@pytest.mark.parametrize(
    "url", ["\x01x", "http://[::1", "http://256.0.0.1:1", "::", "http://x:" + "9" * 50_000]
)
def test_an_address_that_is_no_url_is_refused_with_the_fix(url: str) -> None:
    with pytest.raises(InvalidDaemonUrl) as raised:
        Client(url, token="gmx_t")
    message = str(raised.value)
    assert message.endswith("give --url or GPUMUX_URL as http://HOST:PORT or unix:/path/to.sock")
    assert "\x01" not in message
    assert len(message) < 400


@pytest.mark.parametrize("url", ["http://" + "a" * 64, "http://.."])
def test_a_host_no_dns_label_can_hold_is_refused_when_asked(url: str) -> None:
    with Client(url, token="gmx_t", timeout=5) as api, pytest.raises(InvalidDaemonUrl) as raised:
        api.health()
    assert str(raised.value).endswith("http://HOST:PORT or unix:/path/to.sock")


@pytest.mark.parametrize("token", ["gmx_é", "gmx_a\r\nX-Forged: 1", "gmx_\x01"])
def test_a_token_no_header_can_carry_is_refused_before_any_request(token: str) -> None:
    with pytest.raises(InvalidToken):
        Client(f"http://127.0.0.1:{free_port()}", token=token)


@pytest.mark.parametrize("user", ["a?b=1", "a#b", "..", ".", "%2e%2e", "a b", "a\x01"])
def test_a_user_name_is_one_segment_of_the_path_whatever_it_holds(
    client: Client, user: str
) -> None:
    revoked = client.revoke_tokens(user)
    assert (revoked.user, revoked.revoked) == (user, 0)


def test_a_daemon_on_a_unix_socket(tmp_path: Path) -> None:
    url = f"unix:{tmp_path / 'gpumux.sock'}"
    with embedded(Settings(home=tmp_path / "home", url=url)) as running:
        assert running.url == url
        with Client(url, timeout=10) as api:
            assert api.health().status == "ok"
    with Client(url, timeout=5) as api, pytest.raises(DaemonUnreachable):
        api.health()


def test_error_detail_of_responses_that_are_not_fastapis() -> None:
    assert error_detail(httpx.Response(502, text="bad gateway\n")) == "bad gateway"
    assert error_detail(httpx.Response(500)) == "HTTP 500 Internal Server Error"
    assert error_detail(httpx.Response(409, json={"detail": "busy"})) == "busy"


def test_error_detail_of_a_problem_is_one_line_per_refused_field() -> None:
    refused = Problem(
        detail="2 fields refused: body.name: too long; query.limit: too small",
        errors=[
            FieldProblem(loc=["body", "params", 0], msg="Input should be a string", type="x"),
            FieldProblem(loc=["query", "limit"], msg="Input should be at least 1", type="y"),
        ],
    )
    response = httpx.Response(422, content=refused.model_dump_json())
    assert error_detail(response) == (
        "params.0: Input should be a string\nlimit: Input should be at least 1"
    )
    not_json = Problem(
        detail="1 field refused: body: not valid JSON: it is not UTF-8 text",
        errors=[FieldProblem(loc=["body"], msg="not valid JSON: it is not UTF-8 text", type="z")],
    )
    response = httpx.Response(422, content=not_json.model_dump_json())
    assert error_detail(response) == "not valid JSON: it is not UTF-8 text"


def test_error_detail_of_a_problem_without_fields_is_its_detail() -> None:
    too_large = Problem(detail="the request's body is over the daemon's limit")
    response = httpx.Response(413, content=too_large.model_dump_json())
    assert error_detail(response) == "the request's body is over the daemon's limit"


def test_only_an_https_client_loads_the_certificates_it_verifies_against(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # httpx builds a verifying client's context with ssl.create_default_context (its CA bundle
    # or the system's, by SSL_CERT_FILE): a client that speaks plain HTTP needs none.
    made: list[ssl.SSLContext] = []
    default = ssl.create_default_context

    def counted(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        made.append(default(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(ssl, "create_default_context", counted)
    Client("unix:/nonexistent/gpumux.sock").close()
    Client("http://127.0.0.1:1", token="t").close()
    assert made == [], "a plain HTTP client loaded certificates it never uses"
    Client("https://gpumux.example:8443", token="t").close()
    (context,) = made
    assert context.verify_mode == ssl.CERT_REQUIRED and context.cert_store_stats()["x509_ca"]
