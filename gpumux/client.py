"""A small synchronous client for the daemon's REST API, over TCP or a Unix socket."""

from __future__ import annotations

import os
import socket
import ssl
import urllib.parse
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
from pydantic import TypeAdapter

from gpumux.config import default_home
from gpumux.home import tokenfile
from gpumux.schemas.common import FieldProblem, Problem
from gpumux.schemas.devices import DevicePublic
from gpumux.schemas.health import Health
from gpumux.schemas.nodes import NodePublic
from gpumux.schemas.profiles import ProfileMeasured, ProfilePublic, ProfilesPublic
from gpumux.schemas.reports import ReportPublic, ReportsPublic
from gpumux.schemas.sweeps import SweepCreate, SweepDetail, SweepsPublic
from gpumux.schemas.tokens import TokenCreate, TokenCreated, TokensRevoked
from gpumux.schemas.trials import LogChunk, TrialPublic, TrialsPublic
from gpumux.status import SweepStatus, TrialStatus
from gpumux.text import cut, quoted

DEFAULT_TIMEOUT = 30.0
UNIX_PREFIX = "unix:"
# The TLS context of a client that speaks plain HTTP (a Unix socket, http://): it trusts no
# certificate. httpx's default loads the CA bundle for each client, 20-600 ms of each CLI
# command for a TLS it never uses; an https:// URL keeps the default.
PLAIN_HTTP = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
# The API's largest page of trials (GET /sweeps/{id}/trials?limit=).
TRIALS_PAGE = 1000
# The API's largest page of a trial's reports (GET /trials/{id}/reports?limit=).
REPORTS_PAGE = 10_000
# How much of a refused URL, or of the reason, an error message quotes: either may hold
# anything the user typed, of any length.
SHOWN_CHARS = 80

_devices = TypeAdapter(list[DevicePublic])
_nodes = TypeAdapter(list[NodePublic])


def data_home() -> Path:
    """The data directory a daemon of this user keeps (and its own token in): GPUMUX_HOME."""
    return Path(os.environ.get("GPUMUX_HOME") or default_home())


class ApiError(RuntimeError):
    """The daemon refused a request; str() is its explanation."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail


class DaemonUnreachable(ConnectionError):
    """No gpumux daemon answers at `url`."""

    def __init__(self, url: str, reason: str = "") -> None:
        super().__init__(f"no gpumux daemon answers at {url}" + (f" ({reason})" if reason else ""))
        self.url = url
        self.reason = reason


class InvalidDaemonUrl(ValueError):
    """`url` cannot be the address of a daemon; str() says why and what to give instead."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(
            f"the daemon's address {quoted(url, SHOWN_CHARS)} is not a URL "
            f"({cut(reason, SHOWN_CHARS)}): give --url or GPUMUX_URL as http://HOST:PORT or "
            "unix:/path/to.sock"
        )
        self.url = url


class InvalidToken(ValueError):
    """The API token found (GPUMUX_TOKEN or a token file) cannot go in a request's header."""

    def __init__(self) -> None:
        super().__init__(
            "the API token in GPUMUX_TOKEN or your token file holds characters no gpumux token "
            "has (it was mangled): make a new one with `gpumux token create`"
        )


def error_detail(response: httpx.Response) -> str:
    """The daemon's explanation of an error response (a Problem): one line per refused field,
    else its one-line detail."""
    try:
        problem = Problem.model_validate_json(response.content)
    except ValueError:
        return response.text.strip() or f"HTTP {response.status_code} {response.reason_phrase}"
    if problem.errors:
        return "\n".join(_field_line(field) for field in problem.errors)
    return problem.detail


def _field_line(field: FieldProblem) -> str:
    """One refused field as "field: message"."""
    # loc starts with where the field came from (body, query, path): the field is the rest.
    where = ".".join(str(part) for part in field.loc[1:])
    return f"{where}: {field.msg}" if where else field.msg


class Client:
    """The daemon at `url`: http://HOST:PORT, or unix:/path/to.sock."""

    def __init__(
        self, url: str, *, timeout: float = DEFAULT_TIMEOUT, token: str | None = None
    ) -> None:
        """Over a Unix socket the kernel tells the daemon who we are; over TCP `token` does
        (default: the one tokenfile.discover_token finds). InvalidDaemonUrl when `url` is
        not a URL at all, InvalidToken when the token cannot be sent."""
        self.url = url
        self._uds: str | None = None
        if url.startswith(UNIX_PREFIX):
            self._uds = url.removeprefix(UNIX_PREFIX)
            transport = httpx.HTTPTransport(uds=self._uds, verify=PLAIN_HTTP)
            self._http = httpx.Client(
                transport=transport, base_url="http://gpumux", timeout=timeout
            )
            return
        token = token or tokenfile.discover_token(data_home())
        if token is not None and not (token.isascii() and token.isprintable()):
            # httpx would fail on it in the header, or send a line break into the request.
            raise InvalidToken()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            self._http = httpx.Client(
                base_url=url,
                timeout=timeout,
                headers=headers,
                verify=True if url.startswith("https:") else PLAIN_HTTP,
            )
        except httpx.InvalidURL as error:
            raise InvalidDaemonUrl(url, str(error).rstrip(".")) from None

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as error:
            raise DaemonUnreachable(self.url, str(error) or type(error).__name__) from error
        except UnicodeError as error:
            # A host name no DNS label can hold (too long, empty) fails in its IDNA encoding.
            raise InvalidDaemonUrl(self.url, str(error)) from error
        if response.is_error:
            raise ApiError(response.status_code, error_detail(response))
        return response.json()

    def create_token(self, user: str | None = None) -> TokenCreated:
        """A new API token for `user` (default: whoever asks); over the Unix socket only."""
        return TokenCreated.model_validate(
            self._request("POST", "/tokens", json=TokenCreate(user=user).model_dump())
        )

    def revoke_tokens(self, user: str) -> TokensRevoked:
        """Revoke every token of `user`."""
        return TokensRevoked.model_validate(self._request("DELETE", f"/tokens/{_segment(user)}"))

    def health(self) -> Health:
        """The daemon's version, database and queue."""
        if self._uds is not None:
            _check_unix_socket(self.url, self._uds)
        return Health.model_validate(self._request("GET", "/health"))

    def create_sweep(self, sweep_in: SweepCreate) -> SweepDetail:
        """Submit a sweep; its trials are queued when this returns."""
        body = sweep_in.model_dump(mode="json")
        return SweepDetail.model_validate(self._request("POST", "/sweeps", json=body))

    def list_sweeps(
        self,
        *,
        status: SweepStatus | None = None,
        owner: str | None = None,
        name: str | None = None,
        offset: int = 0,
        limit: int = 50,
    ) -> SweepsPublic:
        """A page of sweeps (of this name, where given), newest first."""
        query = _query(status=status, owner=owner, name=name, offset=offset, limit=limit)
        return SweepsPublic.model_validate(self._request("GET", "/sweeps", params=query))

    def get_sweep(self, sweep_id: int) -> SweepDetail:
        """One sweep with its counts by status and its best trial."""
        return SweepDetail.model_validate(self._request("GET", f"/sweeps/{sweep_id}"))

    def cancel_sweep(self, sweep_id: int) -> SweepDetail:
        """Ask the daemon to cancel a sweep (it stops the trials soon after)."""
        return SweepDetail.model_validate(self._request("POST", f"/sweeps/{sweep_id}/cancel"))

    def list_trials(
        self,
        sweep_id: int,
        *,
        status: TrialStatus | None = None,
        offset: int = 0,
        limit: int = 100,
    ) -> TrialsPublic:
        """A page of a sweep's trials in their order."""
        query = _query(status=status, offset=offset, limit=limit)
        path = f"/sweeps/{sweep_id}/trials"
        return TrialsPublic.model_validate(self._request("GET", path, params=query))

    def all_trials(self, sweep_id: int, *, status: TrialStatus | None = None) -> list[TrialPublic]:
        """Every trial of a sweep (or those in `status`), page by page."""
        trials: list[TrialPublic] = []
        while True:
            page = self.list_trials(sweep_id, status=status, offset=len(trials), limit=TRIALS_PAGE)
            trials.extend(page.data)
            if not page.data or len(trials) >= page.count:
                return trials

    def get_trial(self, trial_id: int) -> TrialPublic:
        """One trial; a failed one carries its exit status and last log lines in `error`."""
        return TrialPublic.model_validate(self._request("GET", f"/trials/{trial_id}"))

    def get_log(self, trial_id: int, offset: int | None = None) -> LogChunk:
        """A chunk of the trial's log from `offset` (its tail when None)."""
        query = _query(offset=offset)
        return LogChunk.model_validate(
            self._request("GET", f"/trials/{trial_id}/log", params=query)
        )

    def list_reports(self, trial_id: int, *, offset: int = 0, limit: int = 1000) -> ReportsPublic:
        """A page of what the trial reported (every attempt), in the order it came."""
        query = _query(offset=offset, limit=limit)
        path = f"/trials/{trial_id}/reports"
        return ReportsPublic.model_validate(self._request("GET", path, params=query))

    def all_reports(self, trial_id: int) -> list[ReportPublic]:
        """Every report of a trial, of all its attempts, page by page."""
        reports: list[ReportPublic] = []
        while True:
            page = self.list_reports(trial_id, offset=len(reports), limit=REPORTS_PAGE)
            reports.extend(page.data)
            if not page.data or len(reports) >= page.count:
                return reports

    def devices(self) -> list[DevicePublic]:
        """Every device the scheduler sees, with the trials packed on it."""
        return _devices.validate_python(self._request("GET", "/devices"))

    def nodes(self) -> list[NodePublic]:
        """Every node that joined the daemon's database: state, lease, devices, trials."""
        return _nodes.validate_python(self._request("GET", "/nodes"))

    def list_profiles(self, *, offset: int = 0, limit: int = 50) -> ProfilesPublic:
        """A page of throughput profiles, the most recently updated first."""
        query = _query(offset=offset, limit=limit)
        return ProfilesPublic.model_validate(self._request("GET", "/profiles", params=query))

    def get_profile(self, profile_id: int) -> ProfilePublic:
        """One throughput profile with its curve."""
        return ProfilePublic.model_validate(self._request("GET", f"/profiles/{profile_id}"))

    def store_profile(self, measured: ProfileMeasured) -> ProfilePublic:
        """Keep a curve measured outside a sweep as its workload's profile, settled."""
        body = measured.model_dump(mode="json")
        return ProfilePublic.model_validate(self._request("PUT", "/profiles", json=body))


def _check_unix_socket(url: str, path: str) -> None:
    """DaemonUnreachable if nothing accepts connections at the Unix socket `path`."""
    # httpcore 1.0.9 leaves the socket of a failed Unix connect open (a ResourceWarning):
    # find out with a socket closed here, before httpx tries.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError as error:
            raise DaemonUnreachable(url, error.strerror or str(error)) from error


def _segment(text: str) -> str:
    """`text` as one segment of a URL's path, whatever its characters."""
    # Dots too: httpx would resolve a segment of "." or ".." as a directory, as a browser does.
    return urllib.parse.quote(text, safe="").replace(".", "%2E")


def _query(**values: Any) -> dict[str, Any]:
    """Query parameters without the ones left out (None)."""
    return {name: str(value) for name, value in values.items() if value is not None}
