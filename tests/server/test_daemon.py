from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from builders import daemon_bearer
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families

from gpumux.config import Settings
from gpumux.devices.probes import DeviceProbe
from gpumux.devices.snapshot import DeviceSnapshot
from gpumux.home.lockfile import DaemonAlreadyRunning, DaemonError
from gpumux.server.daemon import Daemon, embedded
from gpumux.server.listening import bind_tcp, listen_where_clients_look
from gpumux.storage.models import Node

FIXTURES = Path(__file__).parents[1] / "fixtures"


def free_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def wait_finished(client: httpx.Client, sweep_id: int) -> dict[str, object]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        sweep = client.get(f"/sweeps/{sweep_id}").json()
        if sweep["status"] in ("finished", "cancelled"):
            return dict(sweep)
        time.sleep(0.05)
    raise AssertionError(f"sweep {sweep_id} did not finish")


def test_the_embedded_daemon_runs_a_sweep_over_http(tmp_path: Path) -> None:
    port = free_port()
    settings = Settings(home=tmp_path / "home", url=f"http://127.0.0.1:{port}")
    with embedded(settings) as daemon:
        assert daemon.url == f"http://127.0.0.1:{port}"
        headers = daemon_bearer(settings.home)
        with httpx.Client(base_url=daemon.url, timeout=10, headers=headers) as client:
            assert client.get("/health").json()["status"] == "ok"
            created = client.post(
                "/sweeps",
                json={
                    "params": ["x=1,2,3"],
                    "command": [sys.executable, str(FIXTURES / "echo_env.py")],
                    "workdir": str(tmp_path),
                    "env": dict(os.environ),
                    "split": 2,
                },
            )
            assert created.status_code == 201
            sweep = wait_finished(client, created.json()["id"])
            assert sweep["counts"] == {"succeeded": 3}
            devices = client.get("/devices").json()
            assert [d["key"] for d in devices] == ["cpu"]
    assert (tmp_path / "home" / "gpumux.db").exists()


def test_a_second_daemon_on_one_database_is_refused_and_told_where_the_first_is(
    tmp_path: Path,
) -> None:
    settings = Settings(home=tmp_path / "home", url=f"http://127.0.0.1:{free_port()}")
    with embedded(settings) as first:
        with pytest.raises(DaemonAlreadyRunning) as refused:
            with embedded(settings):
                pass
        assert refused.value.url == first.url
        assert f"pid {os.getpid()}" in str(refused.value)


def test_a_second_daemon_on_one_data_directory_is_refused_even_with_its_own_database(
    tmp_path: Path,
) -> None:
    settings = Settings(home=tmp_path / "home", url=f"http://127.0.0.1:{free_port()}")
    other = Settings(
        home=tmp_path / "home", db=tmp_path / "other.db", url=f"http://127.0.0.1:{free_port()}"
    )
    with embedded(settings) as first:
        with pytest.raises(DaemonAlreadyRunning, match="using the data directory"):
            with embedded(other):
                pass
        with httpx.Client(base_url=first.url, timeout=10) as client:
            assert client.get("/health").json()["status"] == "ok", "the first one serves on"


def test_a_daemon_on_every_interface_tells_other_nodes_its_host_name(tmp_path: Path) -> None:
    # Another node that connected to 0.0.0.0 would reach itself, not this daemon.
    port = free_port()
    settings = Settings(home=tmp_path / "home", url=f"http://0.0.0.0:{port}")
    with embedded(settings) as daemon:
        assert daemon.sessions is not None and daemon.node is not None
        with daemon.sessions.read() as session:
            node = session.get(Node, daemon.node.id)
            assert node is not None
            assert node.url == f"http://{socket.getfqdn()}:{port}"


def test_a_unix_socket_url_makes_the_daemon_listen_there(tmp_path: Path) -> None:
    sock = tmp_path / "gpumux.sock"
    settings = Settings(home=tmp_path / "home", url=f"unix:{sock}")
    with embedded(settings) as daemon:
        assert daemon.url == f"unix:{sock}"
        assert oct(sock.stat().st_mode & 0o777) == "0o600"
        transport = httpx.HTTPTransport(uds=str(sock))
        with httpx.Client(transport=transport, base_url="http://gpumux") as client:
            assert client.get("/health").json()["status"] == "ok"
    assert not sock.exists()


def test_a_url_that_is_neither_http_nor_unix_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DaemonError, match="must be http://HOST:PORT or unix:/PATH"):
        listen_where_clients_look(Settings(home=tmp_path, url="ftp://x"))


def test_by_default_the_daemon_listens_on_an_owner_only_socket_in_its_data_directory(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    settings = Settings(home=home)
    assert settings.url == f"unix:{home}/gpumux.sock"
    with embedded(settings) as daemon:
        assert daemon.url == settings.url
        modes = {
            path.name: oct(path.stat().st_mode & 0o777)
            for path in (home, home / "gpumux.sock", home / "gpumux.db", home / "logs")
        }
        assert modes == {
            "home": "0o700",
            "gpumux.sock": "0o600",
            "gpumux.db": "0o600",
            "logs": "0o700",
        }


def test_a_socket_path_too_long_for_unix_is_refused_with_the_way_out(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / ("x" * 120))
    with pytest.raises(DaemonError, match="too long for a Unix socket.*GPUMUX_URL=unix:"):
        with embedded(settings):
            pass


def test_a_data_directory_that_cannot_be_made_is_refused_with_the_way_out(
    tmp_path: Path,
) -> None:
    # A name longer than the filesystem takes (255 bytes), as a mistyped --home can be.
    settings = Settings(home=tmp_path / ("y" * 300), url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(DaemonError, match="cannot make the data directory '.*…': File name too"):
        Daemon(settings).start()


def test_serve_listens_where_the_cli_looks_unless_given_a_port(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMUX_")}
    server = subprocess.Popen(
        [sys.executable, "-m", "gpumux", "serve", "--home", str(home)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    line = server.stdout.readline()
    try:
        assert line.startswith(f"gpumux: serving on unix:{home}/gpumux.sock"), line
        transport = httpx.HTTPTransport(uds=str(home / "gpumux.sock"))
        with httpx.Client(transport=transport, base_url="http://gpumux") as client:
            assert client.get("/health").json()["status"] == "ok"
    finally:
        server.send_signal(signal.SIGTERM)
        server.stdout.close()
        assert server.wait(timeout=60) == 0


class SlowToStart:
    """A probe whose first snapshot takes a second, as NVML's start can on a host of many GPUs."""

    def __init__(self, probe: DeviceProbe) -> None:
        self.probe = probe
        self.started = False

    def snapshot(self) -> list[DeviceSnapshot]:
        if not self.started:
            time.sleep(1.0)
            self.started = True
        return self.probe.snapshot()

    def close(self) -> None:
        self.probe.close()


def test_the_daemon_offers_only_the_gpus_it_is_given_from_its_first_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scripted_nvml import scripted_nvml

    import gpumux.server.daemon
    from gpumux.devices.probes import make_probe

    nvml = scripted_nvml("two_gpus")
    # NVML cannot start here: the daemon's own probe path runs over the scripted NVML.
    monkeypatch.setattr(
        gpumux.server.daemon,
        "make_probe",
        lambda *, visible: SlowToStart(make_probe(nvml=nvml, visible=visible)),
    )
    settings = Settings(home=tmp_path / "home", gpus=nvml.gpus[1].uuid)
    with embedded(settings) as daemon:
        transport = httpx.HTTPTransport(uds=daemon.url.removeprefix("unix:"))
        with httpx.Client(transport=transport, base_url="http://gpumux") as client:
            # Asked at once, as `gpumux tune` asks its own daemon: the devices are listed.
            devices = client.get("/devices").json()
    assert [device["uuid"] for device in devices] == [nvml.gpus[1].uuid]


class HungAtStart:
    """A probe whose first snapshot waits until the test lets it go, as a hung NVML would."""

    def __init__(self, probe: DeviceProbe) -> None:
        self.probe = probe
        self.release = threading.Event()

    def snapshot(self) -> list[DeviceSnapshot]:
        assert self.release.wait(timeout=120), "the test never let the probe go"
        return self.probe.snapshot()

    def close(self) -> None:
        self.probe.close()


def test_a_first_probe_that_hangs_delays_the_api_only_so_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpumux.server.daemon
    from gpumux.devices.probes import make_probe

    hung: list[HungAtStart] = []

    def probe(*, visible: object) -> HungAtStart:
        hung.append(HungAtStart(make_probe(visible=None)))
        return hung[-1]

    monkeypatch.setattr(gpumux.server.daemon, "make_probe", probe)
    monkeypatch.setattr(gpumux.server.daemon, "FIRST_PROBE_WAIT_S", 0.5)
    settings = Settings(home=tmp_path / "home")
    with embedded(settings) as daemon:
        try:
            transport = httpx.HTTPTransport(uds=daemon.url.removeprefix("unix:"))
            with httpx.Client(transport=transport, base_url="http://gpumux", timeout=30) as client:
                # The probe still hangs: the API answers, without the devices it has not seen.
                assert client.get("/health").json()["status"] == "ok"
                assert client.get("/devices").json() == []
                (probe_,) = hung
                probe_.release.set()
                deadline = time.monotonic() + 30
                while not client.get("/devices").json():
                    assert time.monotonic() < deadline, "the devices never came"
                    time.sleep(0.05)
        finally:
            for each in hung:
                each.release.set()


def test_the_daemon_reports_its_scheduler_ticks_in_its_metrics(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", url=f"http://127.0.0.1:{free_port()}")
    with embedded(settings) as daemon, httpx.Client(base_url=daemon.url, timeout=10) as client:
        deadline = time.monotonic() + 30
        while True:
            families = {
                family.name: family
                for family in text_string_to_metric_families(client.get("/metrics").text)
            }
            ticks = families["gpumux_scheduler_tick_seconds"].samples
            count = next(s.value for s in ticks if s.name.endswith("_count"))
            if count > 0:
                break
            assert time.monotonic() < deadline, "no scheduler tick was recorded"
            time.sleep(0.05)
        assert next(s.value for s in ticks if s.name.endswith("_sum")) > 0


def test_a_socket_that_cannot_be_made_is_refused_with_the_way_out(tmp_path: Path) -> None:
    where = tmp_path / "no-such-dir" / "gpumux.sock"
    settings = Settings(home=tmp_path / "home", uds=where)
    with pytest.raises(DaemonError, match=f"cannot listen on the socket {where}: No such file"):
        Daemon(settings).start()
    with embedded(Settings(home=tmp_path / "home", url=f"http://127.0.0.1:{free_port()}")):
        pass  # the refused daemon released its locks


def test_tcp_connections_send_small_answers_without_waiting_for_an_ack(tmp_path: Path) -> None:
    """TCP_NODELAY on each accepted connection: an answer written in two pieces (head, body)
    must not wait for the client's delayed ACK (40 ms a request)."""
    listener, _ = bind_tcp(
        Settings(home=tmp_path / "home", host="127.0.0.1", port=0), fallback_port=False
    )

    async def nodelay_of_an_accepted_connection() -> int:
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def handle(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connection = writer.get_extra_info("socket")
            accepted.set_result(connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        async with await asyncio.start_server(handle, sock=listener):
            _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
            nodelay = await asyncio.wait_for(accepted, timeout=30)
            writer.close()
        return nodelay

    assert asyncio.run(nodelay_of_an_accepted_connection()) != 0


def test_a_database_that_is_a_directory_is_refused_with_the_way_out(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", db=tmp_path, url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(DaemonError, match="cannot create the database .*--db or GPUMUX_DB"):
        Daemon(settings).start()


def test_a_database_name_with_no_room_for_its_journal_is_refused_before_it_is_made(
    tmp_path: Path,
) -> None:
    # The longest name SQLite can keep its -journal beside (8 bytes) is taken; one byte more,
    # which the file itself would fit, is refused before the file or its directory is made.
    longest = os.pathconf(tmp_path, "PC_NAME_MAX") - len("-journal")
    with embedded(
        Settings(home=tmp_path / "home", db=tmp_path / ("d" * longest), url=free_url())
    ) as daemon:
        assert daemon.url
    db = tmp_path / "new" / ("d" * (longest + 1))
    settings = Settings(home=tmp_path / "home", db=db, url=free_url())
    with pytest.raises(DaemonError, match="no room for its -journal/-wal/-shm/.lock files"):
        Daemon(settings).start()
    assert not db.parent.exists()


def test_a_database_named_by_a_link_needs_room_beside_its_target_for_sqlite_and_its_own_lock(
    tmp_path: Path,
) -> None:
    # SQLite keeps its journal beside the file it opens, gpumux its lock beside the name given.
    longest = os.pathconf(tmp_path, "PC_NAME_MAX")
    link = tmp_path / ("l" * (longest - len(".lock")))
    link.symlink_to(tmp_path / "target.db")
    with embedded(Settings(home=tmp_path / "home", db=link, url=free_url())) as daemon:
        assert daemon.url


def test_a_socket_path_that_is_a_directory_is_refused_with_the_way_out(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", uds=tmp_path)
    with pytest.raises(DaemonError, match="cannot listen on the socket .*--uds or GPUMUX_URL"):
        Daemon(settings).start()
