"""`gpumux top`: frames rendered from constructed data, and the command against a real daemon."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

from builders import terminal_signals
from rich.console import Console, RenderableType
from test_cli import (
    DEADLINE_S,
    WAIT_FOR_FILE,
    Server,
    client,
    gpumux,
    server,
    submit,
    wait_ended,
    wait_running,
)

from gpumux.cli import top
from gpumux.client import Client
from gpumux.schemas.devices import DevicePublic, DeviceShare, DeviceTrial
from gpumux.schemas.health import Health
from gpumux.schemas.sweeps import SweepPublic
from gpumux.schemas.trials import TrialPublic
from gpumux.status import SweepStatus, TrialStatus

__all__ = ["client", "server"]  # fixtures shared with test_cli
NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
URL = "http://127.0.0.1:7683"


def device(key: str, **fields: Any) -> DevicePublic:
    """A healthy H200 named `key`, with `fields` changed."""
    values: dict[str, Any] = dict(
        key=key,
        kind="gpu",
        index=0,
        name="NVIDIA H200",
        uuid=f"GPU-{key}",
        memory_total_mb=143_771,
        memory_used_mb=45_000,
        memory_free_mb=98_771,
        utilization_pct=87,
        cpu_count=None,
        work_cores=None,
        error=None,
        trials=[],
        mix=[],
        load=0.0,
        load_fraction="0",
    )
    values.update(fields)
    return DevicePublic.model_validate(values)


def share(
    sweep_id: int, split: int, trials: int, owner: str | None = "ada", **fields: Any
) -> DeviceShare:
    """An entry of a device's mix: `trials` of the sweep at `split`, as the API answers it."""
    values: dict[str, Any] = dict(
        sweep_id=sweep_id, owner=owner, name=None, split=split, trials=trials, share=trials / split
    )
    values.update(fields)
    return DeviceShare.model_validate(values)


def packed(trial_id: int, sweep_id: int, slot: int, **fields: Any) -> DeviceTrial:
    values: dict[str, Any] = dict(
        trial_id=trial_id, sweep_id=sweep_id, slot=slot, memory_limit_mb=None, samples_per_s=None
    )
    values.update(fields)
    return DeviceTrial.model_validate(values)


def sweep_public(sweep_id: int, command: list[str]) -> SweepPublic:
    return SweepPublic(
        id=sweep_id,
        name=None,
        owner="ada",
        status=SweepStatus.running,
        command=command,
        params=["lr=1e-3..1e-1"],
        workdir="/tmp",
        trials=None,
        seed=0,
        split=2,
        metric=None,
        mode=None,
        time_limit_s=None,
        retries=0,
        priority=0,
        trial_count=4,
        cancel_requested=False,
        created_at=NOW,
        finished_at=None,
        counts={TrialStatus.running: 2, TrialStatus.queued: 2},
    )


def health(*, queued: int, active: int) -> Health:
    return Health(
        status="ok",
        version="0.1.0",
        database="/x/gpumux.db",
        devices=3,
        queued_trials=queued,
        active_trials=active,
    )


def text_of(renderable: RenderableType) -> str:
    console = Console(record=True, width=120)
    console.print(renderable)
    return console.export_text()


def block(lines: list[str], header: str) -> list[str]:
    """The lines from the device header that starts with `header` up to the next device."""
    start = next(n for n, line in enumerate(lines) if line.startswith(header))
    end = next(
        (n for n in range(start + 1, len(lines)) if not lines[n].startswith(" ")), len(lines)
    )
    return lines[start:end]


def cells(line: str) -> str:
    """A table row with its padding squeezed to single spaces."""
    return " ".join(line.split())


def test_a_frame_shows_each_device_with_its_trials_and_the_queue() -> None:
    h200 = device(
        "gpu0",
        trials=[
            packed(12, 3, 1, memory_limit_mb=20_000),
            packed(11, 3, 0, memory_limit_mb=20_000, samples_per_s=1234.5),
            packed(13, 5, 2, memory_limit_mb=20_000),
        ],
        # Another user's sweep 5: its id and share, not whose it is.
        mix=[share(3, 3, 2, name="lr\x1b[2J sweep"), share(5, 6, 1, owner=None)],
        load=5 / 6,
        load_fraction="5/6",
    )
    failing = device(
        "gpu1",
        index=1,
        memory_total_mb=None,
        memory_used_mb=None,
        memory_free_mb=None,
        utilization_pct=None,
        error="Unknown Error",
    )
    cpu = device(
        "cpu",
        kind="cpu",
        name="Intel Xeon",
        uuid=None,
        memory_total_mb=7_800,
        memory_used_mb=3_000,
        utilization_pct=None,
        cpu_count=2,
        trials=[packed(20, 4, 0, samples_per_s=10.0)],
        mix=[share(4, 1, 1, owner="bob")],
        load=1.0,
        load_fraction="1",
    )
    frame = top.top_view(
        [h200, failing, cpu],
        health(queued=5, active=3),
        sweeps={
            3: sweep_public(3, ["python", "train.py", "--epochs", "10"]),
            4: sweep_public(4, ["python", "my script.py"]),
        },
        params={11: {"lr": 0.01, "bs": 32}, 12: {"lr": 0.1, "bs": 32}, 20: {"width": 64}},
        url=URL,
        now=NOW,
    )
    lines = text_of(frame).splitlines()

    gpu0 = block(lines, "gpu0 ")
    assert "NVIDIA H200" in gpu0[0]
    assert "43.9/140.4 GiB" in gpu0[0]
    assert "util 87%" in gpu0[0]
    assert "3 trials  load 5/6" in gpu0[0]
    assert "━" in gpu0[0], "a bar of the memory used"
    # Each sweep with its trials over the split they run at; a name's escapes shown, not obeyed.
    assert gpu0[1] == "  mix  #3 ada lr\\x1b[2J sweep 2/3  #5 another user 1/6"
    assert cells(gpu0[2]) == "trial sweep slot mem limit samples/s params command"
    # By slot; the sweep's command after the trial's own parameters.
    assert cells(gpu0[3]) == "11 3 0 20,000 MiB 1,234.5 lr=0.01 bs=32 python train.py --epochs 10"
    assert cells(gpu0[4]) == "12 3 1 20,000 MiB - lr=0.1 bs=32 python train.py --epochs 10"
    assert cells(gpu0[5]) == "13 5 2 20,000 MiB - - -"
    assert len(gpu0) == 6

    gpu1 = block(lines, "gpu1 ")
    assert "error: Unknown Error" in gpu1[0]
    assert "memory -" in gpu1[0]
    assert "util -" in gpu1[0]
    assert "0 trials" in gpu1[0] and "load" not in gpu1[0]
    assert "━" not in gpu1[0], "no bar for memory that could not be read"
    assert gpu1[1:] == ["  no gpumux trial"]

    cpu_block = block(lines, "cpu ")
    assert "Intel Xeon" in cpu_block[0]
    assert "2.9/7.6 GiB" in cpu_block[0]
    assert "2 cores" in cpu_block[0]
    assert "1 trial" in cpu_block[0] and "1 trials" not in cpu_block[0]
    assert "load 1" in cpu_block[0]
    assert cpu_block[1] == "  mix  #4 bob 1/1"
    assert cells(cpu_block[3]) == "20 4 0 - 10.0 width=64 python 'my script.py'"

    assert lines[-1].startswith(f"5 queued  3 active  gpumux 0.1.0 at {URL}, ")


def test_a_frame_of_a_daemon_with_no_device_says_so() -> None:
    lines = text_of(
        top.top_view([], health(queued=0, active=0), sweeps={}, params={}, url=URL, now=NOW)
    ).splitlines()
    assert lines[0] == "the daemon sees no device"
    assert lines[1].startswith("0 queued  0 active")


class CountingClient:
    """Serves trial and sweep details and counts the requests."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, int]] = []

    def get_trial(self, trial_id: int) -> TrialPublic:
        self.requests.append(("trial", trial_id))
        return TrialPublic.model_validate(
            dict(
                id=trial_id, sweep_id=1, number=trial_id, params={"x": trial_id},
                status=TrialStatus.running, attempt=1, failures=0, device="cpu", slot=0, split=2,
                memory_limit_mb=None, cpu_threads=1, pid=None, queued_at=NOW, started_at=NOW,
                ended_at=None, exit_code=None, signal=None, error=None, objective=None,
                samples_per_s=None, last_report_at=None,
            )
        )  # fmt: skip

    def get_sweep(self, sweep_id: int) -> SweepPublic:
        self.requests.append(("sweep", sweep_id))
        return sweep_public(sweep_id, ["python", f"s{sweep_id}.py"])


def test_details_are_fetched_once_per_trial_and_sweep_and_dropped_when_gone() -> None:
    source = CountingClient()
    details = top.Details(source)
    both = device("cpu", trials=[packed(1, 1, 0), packed(2, 1, 1)], mix=[share(1, 2, 2)])
    details.update([both])
    details.update([both])
    assert sorted(source.requests) == [("sweep", 1), ("trial", 1), ("trial", 2)]
    assert details.params == {1: {"x": 1}, 2: {"x": 2}}
    assert details.sweeps[1].command == ["python", "s1.py"]
    details.update([device("cpu", trials=[packed(3, 2, 0)], mix=[share(2, 2, 1)])])
    assert sorted(source.requests[3:]) == [("sweep", 2), ("trial", 3)]
    assert details.params == {3: {"x": 3}}
    assert list(details.sweeps) == [2]


def test_details_of_another_users_sweep_are_not_asked_for() -> None:
    # The daemon refuses them (403) to a user who is not an admin: asking would end `top`.
    source = CountingClient()
    details = top.Details(source)
    shared = device(
        "gpu0",
        trials=[packed(1, 1, 0), packed(2, 2, 1)],
        mix=[share(1, 2, 1), share(2, 2, 1, owner=None)],
    )
    details.update([shared])
    assert sorted(source.requests) == [("sweep", 1), ("trial", 1)]
    assert list(details.sweeps) == [1] and list(details.params) == [1]


def test_top_once_shows_a_running_trial_under_the_cpu(
    server: Server, client: Client, tmp_path: Path
) -> None:
    flag = tmp_path / "go"
    sweep = submit(client, tmp_path, [sys.executable, WAIT_FOR_FILE, str(flag)], "tag=top")
    wait_running(client, sweep.id, 1)
    trial = client.all_trials(sweep.id)[0]
    try:
        # Wide enough for the whole command line, however long the paths in it are.
        env = server.env | {"COLUMNS": "500"}
        once = gpumux("top", "--once", env=env)
        # Piped, top prints one frame and exits as --once does.
        piped = gpumux("top", env=env)
    finally:
        flag.touch()
    assert once.returncode == 0, once.stderr
    assert piped.returncode == 0, piped.stderr
    for result in (once, piped):
        lines = result.stdout.splitlines()
        cpu_block = block(lines, "cpu ")
        assert "1 trial" in cpu_block[0]
        assert trial.split is not None
        assert f"load {Fraction(1, trial.split)}" in cpu_block[0]
        assert cpu_block[1] == f"  mix  #{sweep.id} {sweep.owner} 1/{trial.split}"
        command = f"{sys.executable} {WAIT_FOR_FILE} {flag}"
        rows = [cells(line) for line in cpu_block[3:]]
        assert rows == [f"{trial.id} {sweep.id} 0 - - tag=top {command}"]
        assert lines[-1].startswith("0 queued  1 active  gpumux ")
    assert wait_ended(client, sweep.id).counts == {TrialStatus.succeeded: 1}


def test_ctrl_c_leaves_the_live_view_with_exit_status_0(server: Server) -> None:
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "gpumux", "top", "--interval", "0.2"],
        env=server.env | {"TERM": "xterm-256color"},
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        preexec_fn=terminal_signals,
    )
    os.close(terminal)
    try:
        seen = read_until(controller, process, b"active")
        assert b"queued" in seen
        process.send_signal(signal.SIGINT)
        rest = read_until(controller, process, None)
        assert process.wait(timeout=DEADLINE_S) == 0, (seen + rest).decode(errors="replace")
        assert b"Traceback" not in rest and b"Aborted" not in rest
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(controller)


def read_until(controller: int, process: subprocess.Popen[bytes], marker: bytes | None) -> bytes:
    """What the terminal shows until `marker` appears (None: until the process exits)."""
    seen = b""
    deadline = time.monotonic() + DEADLINE_S
    while marker is None or marker not in seen:
        assert time.monotonic() < deadline, f"no {marker!r} in time: {seen!r}"
        ready, _, _ = select.select([controller], [], [], 0.1)
        if not ready:
            if marker is None and process.poll() is not None:
                return seen
            continue
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the process has closed the terminal
            chunk = b""
        if not chunk:
            assert marker is None, f"the process ended before {marker!r}: {seen!r}"
            return seen
        seen += chunk
    return seen
