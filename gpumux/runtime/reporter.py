"""Reports to the gpumux daemon: POST {GPUMUX_URL}/reports from a background thread.

Training never waits on HTTP: reports go into a bounded queue that one daemon thread drains. A
daemon that does not answer costs one warning line; the reports meanwhile are dropped and counted.
A report is cut to what the daemon accepts before it is sent; one the daemon refuses all the same
(a 4xx answer) is dropped alone, with one warning that quotes the daemon's reason.
"""

from __future__ import annotations

import atexit
import http.client
import json
import math
import os
import socket
import threading
import time
import urllib.parse
from collections import deque

from gpumux.runtime import context
from gpumux.runtime.context import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

MAX_PENDING = 1000
REQUEST_TIMEOUT_S = 5.0
EXIT_FLUSH_TIMEOUT_S = 2.0
# After a failed delivery, reports are dropped for this long rather than sent to a dead daemon.
RETRY_AFTER_S = 5.0
# What POST /reports accepts (gpumux.schemas.reports), mirrored: the runtime imports nothing
# else from gpumux, and the daemon refuses a report beyond them whole (tests check that the two
# agree).
MAX_METRICS = 256
MAX_METRIC_CHARS = 200
MAX_SAMPLES = 1e12
MAX_REPORT_SECONDS = 1e7
# The most of the daemon's reason for a refusal that a warning quotes.
MAX_REASON_CHARS = 300
MAX_POOL_MB = 2**31 - 1
MIB = 2**20
# The framework's pool is read at most this often: PyTorch builds all its allocator's statistics
# to tell it, and a script may report at every batch.
POOL_READ_INTERVAL_S = 1.0


# What the daemon answers about one report (an ended attempt, too large, a field refused): the
# next report may be taken. Any other error (a wrong token, no such trial, not a gpumux daemon
# at all) holds for every report, and is retried after a pause.
REFUSALS = frozenset({409, 413, 422})


class ReportRejected(Exception):
    """The daemon answered a report with an error that holds for every report: it failed, it
    does not know the trial or its token, or it is not the daemon."""


class ReportRefused(Exception):
    """The daemon refused this report (REFUSALS); the message is its reason."""


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket, for GPUMUX_URL='unix:/path/to/socket'."""

    def __init__(self, socket_path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        """Connect to the socket path instead of a host and port."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def finite_metrics(metrics: Mapping[str, object]) -> dict[str, float]:
    """The numeric, finite values as floats; JSON cannot carry NaN and logs hold other things."""
    numbers: dict[str, float] = {}
    for name, value in metrics.items():
        if isinstance(value, str | bytes) or not hasattr(value, "__float__"):
            continue
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            continue
        if math.isfinite(number):
            numbers[str(name)] = number
    return numbers


def report_metrics(metrics: Mapping[str, object]) -> tuple[dict[str, float], str | None]:
    """The finite metrics a report may carry, and why some were left out (None: none was)."""
    numbers = finite_metrics(metrics)
    kept = {name: number for name, number in numbers.items() if _storable(name)}
    why = []
    if len(kept) < len(numbers):
        why.append(
            f"a metric whose name is empty, over {MAX_METRIC_CHARS} characters, or holds a NUL "
            "or a lone surrogate is not reported"
        )
    if len(kept) > MAX_METRICS:
        why.append(f"{len(kept):,} metrics in one report: only the first {MAX_METRICS} are sent")
        kept = dict(list(kept.items())[:MAX_METRICS])
    return kept, "; ".join(why) or None


def _storable(name: str) -> bool:
    """Whether the daemon stores a metric of this name: 1 to MAX_METRIC_CHARS characters of
    valid Unicode, no NUL."""
    if not 0 < len(name) <= MAX_METRIC_CHARS or "\0" in name:
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _bounded(value: float | None, bound: float) -> float | None:
    """The value as a float from 0 to `bound`; None for anything else."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if 0 <= number <= bound else None


class Reporter:
    """Queues this trial's reports and delivers them to the daemon on a daemon thread."""

    def __init__(self, *, url: str | None, token: str | None, trial_id: int, attempt: int) -> None:
        self.url = url
        self.token = token
        self.trial_id = trial_id
        self.attempt = attempt
        self.delivered = 0
        self.dropped = 0
        self._pending: deque[bytes] = deque()
        self._sending = False
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._warned: set[str] = set()
        self._retry_at = 0.0
        # Whether the script's reports carried samples: they are then its throughput, and the
        # optimizer steps the runtime counts (torch_steps) are no longer sent.
        self.reports_samples = False
        # What the framework holds in its device memory pool, in bytes (`pool_from`), as last
        # read: on the monotonic clock for the interval, and as Unix time for the daemon.
        self._pool: Callable[[], int] | None = None
        self._pool_mb: float | None = None
        self._pool_read_at = -math.inf
        self._pool_read_time = 0.0

    def pool_from(self, reader: Callable[[], int]) -> None:
        """Send with each report what `reader` says the framework's memory pool holds on the
        device (bytes): the daemon tells the trial's CUDA context from it."""
        self._pool = reader

    def _pool_now(self) -> int | None:
        """The pool in MiB, read again once POOL_READ_INTERVAL_S has passed; None unread."""
        now = time.monotonic()
        if self._pool is not None and now - self._pool_read_at >= POOL_READ_INTERVAL_S:
            self._pool_read_at, self._pool_read_time = now, time.time()
            try:
                self._pool_mb = _bounded(self._pool() // MIB, MAX_POOL_MB)
            except Exception as err:
                # The framework's own statistics failed: the reports go on without them.
                self._pool, self._pool_mb = None, None
                self._warn_once("pool", f"WARNING: the device memory pool cannot be read: {err!r}")
        return None if self._pool_mb is None else int(self._pool_mb)

    def submit(
        self,
        *,
        kind: str,
        step: int | None,
        samples: float | None,
        seconds: float | None,
        metrics: Mapping[str, object],
        steps: float | None = None,
        no_gpu: str | None = None,
    ) -> None:
        """Queue one report: metrics at `step`, samples (or optimizer steps) processed in the
        interval of `seconds`; `no_gpu`: the framework that sees no GPU on this trial's GPU."""
        numbers, left_out = report_metrics(metrics)
        if left_out is not None:
            self._warn_once("metrics", f"WARNING: {left_out}")
        sent_samples = _bounded(samples, MAX_SAMPLES)
        if samples is not None and sent_samples is None:
            self._warn_once(
                "samples",
                f"WARNING: samples must be a finite number from 0 to {MAX_SAMPLES:g}: "
                "reports go without them",
            )
        if sent_samples is not None:
            self.reports_samples = True
        body = {
            "trial_id": self.trial_id,
            "attempt": self.attempt,
            "kind": kind,
            "step": step,
            "samples": sent_samples,
            # Measured here: only an interval of months is beyond the bound.
            "seconds": _bounded(seconds, MAX_REPORT_SECONDS),
            "metrics": numbers,
        }
        sent_steps = _bounded(steps, MAX_SAMPLES)
        if sent_steps is not None:
            body["steps"] = sent_steps
        if no_gpu is not None:
            body["no_gpu"] = no_gpu
        pool_mb = self._pool_now()
        if pool_mb is not None:
            # When it was read: a reading of a second ago is no figure of what is held now.
            # Rounded down: a read time a moment late would pass for a newer reading.
            read_at = math.floor(self._pool_read_time * 1000) / 1000
            body["pool_mb"], body["pool_at"] = pool_mb, read_at
        data = json.dumps(body, allow_nan=False).encode()
        with self._changed:
            if len(self._pending) >= MAX_PENDING:
                self.dropped += 1
                return
            self._pending.append(data)
            self._changed.notify_all()
            if self._thread is None:
                self._pid = os.getpid()
                self._thread = threading.Thread(
                    target=self._run, name="gpumux-reporter", daemon=True
                )
                self._thread.start()
                atexit.register(self._flush_at_exit)

    def flush(self, timeout: float) -> bool:
        """Wait until every queued report was delivered or dropped; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._pending and not self._sending, timeout)

    def _flush_at_exit(self) -> None:
        # A forked child inherits this handler but not the thread that would drain the queue.
        if os.getpid() != self._pid or self.flush(EXIT_FLUSH_TIMEOUT_S):
            return
        with self._changed:
            unsent = len(self._pending) + int(self._sending)
        say(f"WARNING: {unsent} report(s) not sent at exit: the gpumux daemon answers too slowly")

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._pending))
                data = self._pending.popleft()
                self._sending = True
            delivered = self._deliver(data)
            with self._changed:
                self._sending = False
                if delivered:
                    self.delivered += 1
                else:
                    self.dropped += 1
                self._changed.notify_all()

    def _deliver(self, data: bytes) -> bool:
        if time.monotonic() < self._retry_at:
            return False
        try:
            self._post(data)
        except ReportRefused as refusal:
            # This report, not the daemon: the next one is sent as usual.
            self._warn_once(
                "refused",
                f"WARNING: the gpumux daemon refused a report ({refusal}); training goes on, "
                "reports it refuses are dropped",
            )
            return False
        except (OSError, http.client.HTTPException, ValueError, ReportRejected) as err:
            self._retry_at = time.monotonic() + RETRY_AFTER_S
            self._warn_once(
                "unreachable",
                f"WARNING: cannot report to the gpumux daemon at {self.url} ({err}); "
                "training goes on, reports are dropped while the daemon does not answer",
            )
            return False
        return True

    def _warn_once(self, what: str, message: str) -> None:
        """Say `message` the first time something of kind `what` happens to this reporter."""
        if what not in self._warned:
            self._warned.add(what)
            say(message)

    def _post(self, data: bytes) -> None:
        connection, path = self._connect()
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            connection.request("POST", path, body=data, headers=headers)
            response = connection.getresponse()
            answer = response.read()
        finally:
            connection.close()
        status = f"HTTP {response.status} {response.reason}"
        if response.status in REFUSALS:
            raise ReportRefused(f"{status}: {_reason(answer)}")
        if not 200 <= response.status < 300:
            raise ReportRejected(status)

    def _connect(self) -> tuple[http.client.HTTPConnection, str]:
        url = self.url or ""
        if url.startswith("unix:"):
            return UnixHTTPConnection(url.removeprefix("unix:"), REQUEST_TIMEOUT_S), "/reports"
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"GPUMUX_URL={url!r} is not http://HOST:PORT or unix:/PATH")
        connection = http.client.HTTPConnection(
            parts.hostname, parts.port, timeout=REQUEST_TIMEOUT_S
        )
        return connection, parts.path.rstrip("/") + "/reports"


def _reason(answer: bytes) -> str:
    """The daemon's one-line reason in an error answer ({"detail": ...}), shortened."""
    try:
        detail = json.loads(answer)["detail"]
    except (ValueError, TypeError, KeyError, RecursionError):
        return "no reason given"
    text = " ".join(str(detail).split())
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS] + "..."


_lock = threading.Lock()
_reporter: Reporter | None = None


def current() -> Reporter | None:
    """This process's reporter, made on first use from its environment; None outside gpumux."""
    global _reporter
    with _lock:
        if _reporter is None:
            trial = context.current()
            if trial is None:
                return None
            _reporter = Reporter(
                url=trial.url, token=trial.token, trial_id=trial.trial_id, attempt=trial.attempt
            )
        return _reporter


def submit(
    *,
    kind: str,
    step: int | None,
    samples: float | None,
    seconds: float | None,
    metrics: Mapping[str, object],
    steps: float | None = None,
    no_gpu: str | None = None,
) -> None:
    """Queue one report for the daemon; a no-op outside gpumux."""
    reporter = current()
    if reporter is not None:
        reporter.submit(
            kind=kind,
            step=step,
            samples=samples,
            seconds=seconds,
            metrics=metrics,
            steps=steps,
            no_gpu=no_gpu,
        )


def pool_from(reader: Callable[[], int]) -> None:
    """This process's reports carry what `reader` says its framework's device memory pool
    holds (bytes); a no-op outside gpumux."""
    reporter = current()
    if reporter is not None:
        reporter.pool_from(reader)


def _forget_in_child() -> None:
    # A forked child has the parent's queue but not its thread: it starts its own on first use.
    global _lock, _reporter
    _lock = threading.Lock()
    _reporter = None


os.register_at_fork(after_in_child=_forget_in_child)
