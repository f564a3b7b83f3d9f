"""The daemon: uvicorn and the scheduler in one event loop, one database, one lock."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Iterator
from typing import IO

import uvicorn

from gpumux.config import Settings
from gpumux.devices.probes import DeviceProbe, make_probe
from gpumux.devices.simulated.nvml import open_simulated
from gpumux.devices.snapshot import visible_gpus
from gpumux.home.lockfile import (
    DaemonError,
    acquire_home_lock,
    acquire_lock,
    record_holder,
)
from gpumux.processes.spawner_client import Spawner
from gpumux.scheduling.heartbeat import NodeHeartbeat
from gpumux.scheduling.idle import until_idle
from gpumux.scheduling.loop import Scheduler
from gpumux.server import identity, joining
from gpumux.server.api import create_app
from gpumux.server.api.forward import NodeClient
from gpumux.server.listening import bind, listen_where_clients_look, serves_other_users
from gpumux.server.metrics import Metrics
from gpumux.storage import membership
from gpumux.storage.budget import ReportBudget
from gpumux.storage.dialects import dialect_for
from gpumux.storage.dialects.base import DatabaseError
from gpumux.storage.engine import Sessions, make_engine, make_sessions
from gpumux.storage.migrate import upgrade
from gpumux.storage.nodes import NodeIdentity
from gpumux.text import quoted

log = logging.getLogger(__name__)

# A graceful stop the first time, an immediate stop the second; SIGHUP: `serve`'s terminal closed.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# How long the API waits for the first probe of the devices before it answers without them.
FIRST_PROBE_WAIT_S = 10.0


class _Server(uvicorn.Server):
    # The daemon owns SIGINT/SIGTERM (graceful, then immediate stop); uvicorn must not take them.
    def capture_signals(self) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
        return contextlib.nullcontext()


class Daemon:
    """One gpumux daemon: `start()` prepares it, `serve()` runs it until stopped."""

    def __init__(
        self, settings: Settings, *, probe: DeviceProbe | None = None, personal: bool = False
    ) -> None:
        self.settings = settings
        self._probe = probe
        # The CLI's embedded daemon serves the user who runs it, whoever that is.
        self.personal = personal
        self._lock: IO[str] | None = None
        self._home_lock: IO[str] | None = None
        self._sockets: list[socket.socket] = []
        self.url = ""
        self.urls: list[str] = []
        # The database, as messages name it (its dialect's label); set by start().
        self.database = ""
        self.sessions: Sessions | None = None
        self.scheduler: Scheduler | None = None
        # The node this daemon joined as among those sharing its database; set by start().
        self.node: NodeIdentity | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signals: asyncio.Queue[int] | None = None
        self._stop_requests = 0

    def start(self, *, fallback_port: bool = False) -> None:
        """Take the lock, migrate the database, bind the socket."""
        try:
            self._start(fallback_port=fallback_port)
        except DatabaseError as error:
            raise DaemonError(str(error)) from error

    def _start(self, *, fallback_port: bool) -> None:
        dialect = dialect_for(self.settings.database_url)
        self.database = dialect.label
        # Refused before anything is created there (an SQLite file on a network filesystem).
        dialect.check_location()
        try:
            self.settings.layout.make()
        except OSError as error:
            raise DaemonError(
                f"cannot make the data directory {quoted(str(self.settings.home))}: "
                f"{error.strerror or error}; give another with --home or GPUMUX_HOME"
            ) from error
        try:
            dialect.prepare_location()
        except OSError as error:
            # A directory given as the file, a name too long for the filesystem.
            raise DaemonError(
                f"cannot create the database {quoted(dialect.label)}: "
                f"{error.strerror or error}; give another with --db or GPUMUX_DB"
            ) from error
        lock_path = dialect.lock_path(self.settings.home)
        try:
            self._lock = acquire_lock(lock_path, database=dialect.label)
        except OSError as error:
            raise DaemonError(
                f"cannot open the lock file {quoted(str(lock_path))}: "
                f"{error.strerror or error}; give another database with --db or GPUMUX_DB"
            ) from error
        try:
            self._home_lock = acquire_home_lock(self.settings.home)
            engine = make_engine(self.settings.database_url)
            self.sessions = make_sessions(engine)
            upgrade(engine)
            joining.own_token(self.settings, self.sessions)
            shared = not self.personal and serves_other_users(self.settings)
            listeners = bind(self.settings, fallback_port=fallback_port, shared=shared)
            self._sockets = [sock for sock, _ in listeners]
            self.urls = [url for _, url in listeners]
            self.url = self.urls[0]
            self.node = joining.join(
                self.settings, self.sessions, url=joining.tcp_url(self.urls), database=self.database
            )
        except BaseException:
            self.close()
            raise
        record_holder(self._lock, self.url)

    def _devices(self) -> DeviceProbe:
        """The simulated GPU when one is asked for, else what the host offers."""
        if self.settings.simulated_gpu is not None:
            return open_simulated(
                self.settings.simulated_gpu,
                home=self.settings.home,
                time_scale=self.settings.simulated_time_scale,
            )
        return make_probe(visible=visible_gpus(self.settings.gpus, os.environ))

    async def serve(self) -> None:
        """Run the API and the scheduler until a stop is requested, then stop in order."""
        assert self.sessions is not None and self._sockets, "start() first"
        self._loop = asyncio.get_running_loop()
        self._signals = asyncio.Queue()
        probe = self._probe or self._devices()
        metrics = Metrics()
        spawner = start_spawner(self.settings)
        budget = ReportBudget.of(self.settings)
        self.scheduler = Scheduler(
            settings=self.settings,
            sessions=self.sessions,
            probe=probe,
            url=self.url,
            on_tick=metrics.observe_tick,
            spawner=spawner,
            node=self.node,
            budget=budget,
        )
        scheduler = self.scheduler
        heartbeat = None
        if self.node is not None:
            heartbeat = NodeHeartbeat(
                settings=self.settings,
                sessions=self.sessions,
                scheduler=scheduler,
                node=self.node,
                url=joining.tcp_url(self.urls),
                home=membership.home_id(self.settings.home),
            )
        node_client = NodeClient()
        app = create_app(
            settings=self.settings,
            sessions=self.sessions,
            devices_view=lambda: scheduler.devices,
            notify=scheduler.wake,
            metrics=metrics,
            node=self.node,
            budget=budget,
            node_client=node_client,
        )
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            # Each connection on the Unix socket carries its peer's uid, read from the kernel.
            http=identity.PeerHttpProtocol,
            ws="none",
        )
        server = _Server(config)
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._loop.add_signal_handler(signum, self._signals.put_nowait, signum)
        stop_beating = asyncio.Event()
        heartbeat_task = None
        if heartbeat is not None:
            # Before anything that may wait: the node's lease is held from the start.
            heartbeat_task = asyncio.create_task(heartbeat.run(stop_beating))
        # The devices listed before the API answers (`gpumux tune` asks its daemon at once), for
        # FIRST_PROBE_WAIT_S at most: a slower NVML is the first tick's to wait for.
        first_probe = asyncio.create_task(scheduler.probe_first())
        await asyncio.wait({first_probe}, timeout=FIRST_PROBE_WAIT_S)
        stop_scheduling = asyncio.Event()
        server_task = asyncio.create_task(server.serve(sockets=self._sockets))
        scheduler_task = asyncio.create_task(scheduler.run(stop_scheduling))
        leaving = self._leave_when_idle()
        # Debug: `gpumux serve` has printed where it serves already, once the sockets were bound.
        log.debug("daemon: serving on %s (database %s)", " and ".join(self.urls), self.database)
        try:
            await self._until_stopped(scheduler, scheduler_task, stop_scheduling)
        finally:
            if leaving is not None:
                leaving.cancel()
            server.should_exit = True
            await server_task
            # Still waiting on NVML: the tick's thread ends it, and close() below waits for that.
            first_probe.cancel()
            node_client.close()
            stop_beating.set()
            if heartbeat is not None and heartbeat_task is not None:
                await heartbeat_task
                self._leave(heartbeat)
            failure = scheduler_task.exception() if scheduler_task.done() else None
            scheduler.close()
            probe.close()
            if spawner is not None:
                spawner.close()
            if threading.current_thread() is threading.main_thread():
                for signum in STOP_SIGNALS:
                    self._loop.remove_signal_handler(signum)
            self.close()
        if failure is not None:
            raise DaemonError(f"the scheduler failed: {failure!r}") from failure

    async def _until_stopped(
        self, scheduler: Scheduler, scheduler_task: asyncio.Task[None], stop: asyncio.Event
    ) -> None:
        """Wait for a stop signal (or the scheduler's failure), then stop in order: a graceful stop
        first, an immediate stop if a second signal comes while trials are stopping."""
        assert self._signals is not None
        first = asyncio.create_task(self._signals.get())
        await asyncio.wait([first, scheduler_task], return_when=asyncio.FIRST_COMPLETED)
        stop_trials = self.settings.stop_trials
        if scheduler_task.done():
            first.cancel()
            log.critical("daemon: the scheduler stopped unexpectedly")
        elif stop_trials:
            log.info("daemon: graceful stop: launching nothing new, stopping trials")
        else:
            log.info("daemon: graceful stop: launching nothing new; trials run on")
        stop.set()
        await asyncio.wait([scheduler_task])
        drain = asyncio.create_task(scheduler.drain(stop_trials=stop_trials))
        while not drain.done():
            second = asyncio.create_task(self._signals.get())
            await asyncio.wait([drain, second], return_when=asyncio.FIRST_COMPLETED)
            if second.done():
                log.warning("daemon: immediate stop: killing every trial now")
                await scheduler.force()
            else:
                second.cancel()

    def _leave_when_idle(self) -> asyncio.Task[None] | None:
        """With `leave_when_idle`: a task that asks for a graceful stop once no trial has been
        queued or running on the whole database for that long (a batch job's node leaves)."""
        grace = self.settings.leave_when_idle
        if grace is None:
            return None
        assert self.sessions is not None
        sessions = self.sessions

        async def leave() -> None:
            await until_idle(sessions, grace=grace, poll=self.settings.poll_interval)
            log.info(
                "daemon: no trial queued or running on %s for %g s; leaving", self.database, grace
            )
            self.request_stop()

        return asyncio.create_task(leave())

    def _leave(self, heartbeat: NodeHeartbeat) -> None:
        """Leave the nodes at a stop; trials left running keep the node's row for its return."""
        try:
            heartbeat.leave()
        except Exception as error:
            # Its lease lapses instead, and another node requeues what it held.
            log.error("node %s: could not leave (%s)", heartbeat.node.name, error)

    def request_stop(self) -> None:
        """A graceful stop the first time, an immediate stop the second; safe from any thread."""
        if self._loop is not None and self._signals is not None:
            self._loop.call_soon_threadsafe(self._signals.put_nowait, signal.SIGTERM)

    def close(self) -> None:
        """Release the socket, the database and the lock."""
        if self._sockets:
            for sock in self._sockets:
                sock.close()
            if self.settings.uds is not None:
                with contextlib.suppress(FileNotFoundError):
                    self.settings.uds.unlink()
            self._sockets = []
        if self.sessions is not None:
            self.sessions.engine.dispose()
        for held in (self._home_lock, self._lock):
            if held is not None:
                held.close()
        self._lock = self._home_lock = None


def start_spawner(settings: Settings) -> Spawner | None:
    """The helper that forks trial supervisors, with its preloading partner (started on the
    first --preload trial); None (each starts afresh) when it cannot start."""
    spawner = Spawner.with_preloading(
        runs_dir=settings.layout.runs, preload=settings.preload_modules
    )
    try:
        spawner.start()
    except OSError as error:
        log.warning("daemon: no spawner (%s); each trial's supervisor starts afresh", error)
        return None
    return spawner


@contextlib.contextmanager
def embedded(settings: Settings) -> Iterator[Daemon]:
    """A daemon on a background thread for the length of a `with` block (the CLI's default).

    It listens at settings.url, so other gpumux commands find it while it runs; when that
    port is taken by something else, on a free one.
    """
    # Ctrl-C on `gpumux sweep` means stop: its trials are stopped and requeued, not left behind.
    daemon = Daemon(
        listen_where_clients_look(settings).model_copy(update={"stop_trials": True}),
        personal=True,
    )
    daemon.start(fallback_port=True)
    ready = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        async def main() -> None:
            task = asyncio.create_task(daemon.serve())
            await asyncio.sleep(0)
            ready.set()
            await task

        try:
            asyncio.run(main())
        except BaseException as error:  # reported to the caller's thread
            failure.append(error)
            ready.set()

    thread = threading.Thread(target=run, name="gpumux-daemon", daemon=True)
    thread.start()
    ready.wait()
    try:
        yield daemon
    finally:
        daemon.request_stop()
        while thread.is_alive():
            try:
                thread.join()
            except KeyboardInterrupt:
                # A second Ctrl-C while trials are stopping: an immediate stop, as with `serve`.
                daemon.request_stop()
        if failure:
            raise DaemonError(f"the embedded daemon failed: {failure[0]}") from failure[0]


def serve_forever(settings: Settings) -> None:
    """`gpumux serve`: run in the foreground until SIGTERM or Ctrl-C.

    It listens on --uds, or on TCP when a host or port is given, and otherwise where the CLI
    looks (GPUMUX_URL; by default the socket in the data directory).
    """
    if settings.uds is None and not {"host", "port"} & settings.model_fields_set:
        settings = listen_where_clients_look(settings)
    daemon = Daemon(settings)
    daemon.start()
    print(
        f"gpumux: serving on {' and '.join(daemon.urls)} (database {daemon.database})", flush=True
    )
    asyncio.run(daemon.serve())
