"""`gpumux profiles` as a user runs it, against a real `gpumux serve` holding stored profiles."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ports import free_port

from gpumux.client import Client, DaemonUnreachable
from gpumux.storage import profiles as profile_store
from gpumux.storage.engine import make_engine, make_sessions

DEADLINE_S = 60.0
CURVE = [
    {"split": 1, "throughput": 1000.0, "seconds_per_trial": 30.0, "memory_per_trial_mb": 700.0},
    {"split": 2, "throughput": 1900.0, "seconds_per_trial": 31.5, "memory_per_trial_mb": 700.0},
    {"split": 3, "throughput": 2500.0, "seconds_per_trial": 36.0, "memory_per_trial_mb": 720.0},
    {"split": 5, "throughput": 2550.0, "seconds_per_trial": 58.8, "memory_per_trial_mb": 730.0},
]


@dataclass
class Server:
    url: str
    db: Path
    env: dict[str, str]


def _answers(client: Client, process: subprocess.Popen[bytes]) -> bool:
    assert process.poll() is None, "gpumux serve exited before it answered"
    try:
        return client.health().status == "ok"
    except DaemonUnreachable:
        return False


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`gpumux serve` as a real process on a free port, with a fresh database."""
    root = tmp_path_factory.mktemp("profiles")
    url = f"http://127.0.0.1:{free_port()}"
    env = {name: value for name, value in os.environ.items() if not name.startswith("GPUMUX_")}
    env.update(GPUMUX_HOME=str(root / "home"), GPUMUX_URL=url, PYTHONIOENCODING="utf-8")
    db = root / "gpumux.db"
    port = url.rsplit(":", 1)[1]
    with open(root / "serve.log", "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpumux", "serve", "--port", port, "--db", str(db)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + DEADLINE_S
            with Client(url, timeout=5) as client:
                while not _answers(client, process):
                    assert time.monotonic() < deadline, "gpumux serve did not answer in time"
                    time.sleep(0.05)
            yield Server(url=url, db=db, env=env)
        finally:
            process.send_signal(signal.SIGTERM)
            returncode = process.wait(timeout=DEADLINE_S)
    assert returncode == 0, (root / "serve.log").read_text()


def store_profile(server: Server, **overrides: Any) -> int:
    """A profile written straight into the daemon's database, as the split search would store it."""
    fields: dict[str, Any] = dict(
        device_name="NVIDIA H200",
        fingerprint="c" * 64,
        command=["python", "train.py", "--epochs=3"],
        param_tokens=["bs=128"],
        unit="samples/s",
        curve=CURVE,
        best_split=3,
        settled=True,
        reason="knee: +2% from N=3 to N=5, under 5%",
        sweep_id=None,
    )
    fields.update(overrides)
    engine = make_engine(f"sqlite:///{server.db}")
    try:
        with make_sessions(engine).write.begin() as session:
            return profile_store.save_profile(session=session, **fields).id
    finally:
        engine.dispose()


def gpumux(server: Server, *args: str, columns: int = 200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpumux", *args],
        env={**server.env, "COLUMNS": str(columns)},
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )


def row(output: str, first: str) -> str:
    """The table row whose first cell is `first`."""
    for line in output.splitlines():
        cells = line.replace("│", " ").split()
        if cells and cells[0] == first:
            return line
    raise AssertionError(f"no row starting with {first!r} in:\n{output}")


def cells(line: str) -> list[str]:
    """The cells of one line of a table drawn with │ between its columns."""
    return [cell.strip() for cell in line.split("│")[1:-1]]


def column(output: str, first: str, index: int) -> list[str]:
    """The lines of one cell of the table row whose first cell is `first`, as wrapped."""
    lines = output.splitlines()
    start = lines.index(row(output, first))
    found = [cells(lines[start])[index]]
    for line in lines[start + 1 :]:
        if not line.startswith("│") or cells(line)[0]:
            break
        found.append(cells(line)[index])
    return [text for text in found if text]


def test_profiles_lists_what_the_split_search_stored(server: Server) -> None:
    empty = gpumux(server, "profiles")
    assert empty.returncode == 0 and empty.stdout == ""
    assert "no profiles yet" in empty.stderr
    h200 = store_profile(server)
    cpu = store_profile(
        server,
        device_name="AMD EPYC 9654",
        unit="trials/s",
        curve=CURVE[:2],
        best_split=None,
        settled=False,
    )
    result = gpumux(server, "profiles")
    assert result.returncode == 0, result.stderr
    settled = cells(row(result.stdout, str(h200)))
    assert settled[:4] == [str(h200), "NVIDIA H200", "3", "samples/s"]
    assert settled[-1] == "python train.py --epochs=3"
    assert "cost: bs=128" in column(result.stdout, str(h200), -1)
    searching = cells(row(result.stdout, str(cpu)))
    assert searching[:4] == [str(cpu), "AMD EPYC 9654", "searching", "trials/s"]
    assert result.stdout.index("AMD EPYC") < result.stdout.index("NVIDIA H200")
    first = gpumux(server, "profiles", "--limit", "1")
    assert str(cpu) in first.stdout and "NVIDIA H200" not in first.stdout
    assert "1 of 2 profiles shown" in first.stderr


def test_a_profile_shows_its_curve_as_a_table_and_a_chart_in_80_columns(server: Server) -> None:
    profile_id = store_profile(server, device_name="NVIDIA A100")
    result = gpumux(server, "profiles", str(profile_id), columns=80)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert all(len(line) <= 80 for line in out.splitlines()), out
    assert "NVIDIA A100" in out and "knee: +2% from N=3 to N=5" in out
    assert "3 (settled)" in row(out, "best")
    # The table comes first: its rows are the first to start with each N.
    assert "1.90x" in row(out, "2") and "730 MiB" in row(out, "5") and "58.8s" in row(out, "5")
    assert "2.50x" in row(out, "3") and "best" in row(out, "3")
    chart = out[out.index("aggregate samples/s") :]
    for n in ("1", "2", "3", "5"):
        assert row(chart, n)
    assert "◀ best" in row(chart, "3") and "best" not in row(chart, "5")


def test_the_list_shows_a_profiles_command_and_its_directory_apart(server: Server) -> None:
    workdir = "/home/alice/experiments/digits"
    command = ["python", "examples/digits_keras.py", "--epochs", "10"]
    profile_id = store_profile(
        server, device_name="NVIDIA RTX 4090", workdir=workdir, command=command
    )

    result = gpumux(server, "profiles", columns=120)

    assert result.returncode == 0, result.stderr
    assert all(len(line) <= 120 for line in result.stdout.splitlines()), result.stdout
    assert column(result.stdout, str(profile_id), -1) == [
        "python examples/digits_keras.py --epochs 10",
        f"in {workdir}",
        "cost: bs=128",
    ]
    shown = gpumux(server, "profiles", str(profile_id), columns=100).stdout
    assert row(shown, "command").split()[1:] == ["python", *command[1:]]
    assert row(shown, "directory").split()[1:] == [workdir]


@pytest.mark.parametrize("columns", [80, 120])
def test_the_list_fits_the_terminals_width(server: Server, columns: int) -> None:
    device = "AMD EPYC 7B13 64-Core Processor"
    command = ["/home/alice/.venv/bin/python", "examples/digits_keras.py", "--epochs", "10"]
    workdir = "/home/alice/experiments/digits"
    profile_id = store_profile(
        server,
        device_name=device,
        workdir=workdir,
        command=command,
        best_split=None,
        settled=False,
    )

    result = gpumux(server, "profiles", columns=columns)

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # Every line of the table whole: within the width and closed by its right border.
    assert all(len(line) <= columns and line[-1] in "┓┃┩│┘" for line in lines), result.stdout
    assert " ".join(column(result.stdout, str(profile_id), 1)) == device
    assert cells(row(result.stdout, str(profile_id)))[2] == "searching"
    # The workload's lines as wrapped (a path longer than the column is folded).
    workload = "".join(column(result.stdout, str(profile_id), -1)).replace(" ", "")
    assert workload == f"{''.join(command)}in{workdir}cost:bs=128"
    # When each profile was updated is left out where it would squeeze the workload.
    assert ("updated" in lines[1]) == (columns == 120)


def test_a_profile_whose_sweep_ended_unsettled_says_so_and_what_it_measured(
    server: Server,
) -> None:
    profile_id = store_profile(
        server,
        device_name="NVIDIA V100",
        curve=[CURVE[2], CURVE[1]],
        best_split=None,
        settled=False,
        reason="unsettled: the sweep ended after 2 point(s), the next sweep goes on from them; "
        "measuring N=5",
    )

    shown = gpumux(server, "profiles", str(profile_id), columns=100).stdout
    listed = gpumux(server, "profiles", columns=120).stdout

    assert " ".join(row(shown, "best").split()[2:]) == (
        "measured N=2, 3; unsettled: the sweep ended"
    )
    assert cells(row(listed, str(profile_id)))[2] == "unsettled"
    nothing = store_profile(
        server,
        device_name="NVIDIA P100",
        curve=[],
        best_split=None,
        settled=False,
        reason="unsettled: the sweep ended after 0 point(s), the next sweep goes on from them",
    )
    shown_nothing = gpumux(server, "profiles", str(nothing), columns=100).stdout
    assert " ".join(row(shown_nothing, "best").split()[2:]) == (
        "nothing measured; unsettled: the sweep ended"
    )
    # No best point: the curve's table has no column for its mark.
    header = next(line for line in shown.splitlines() if "memory/trial" in line)
    assert cells(header.replace("┃", "│"))[-1] == "memory/trial"


def test_a_profile_says_the_limits_the_next_sweep_stays_under(server: Server) -> None:
    plain = store_profile(server, device_name="NVIDIA T4")
    limited = store_profile(server, device_name="NVIDIA L40S", oom_at=8, ceiling=6)
    assert row(gpumux(server, "profiles", str(plain)).stdout, "limits").split()[-1] == "-"
    shown = row(gpumux(server, "profiles", str(limited)).stdout, "limits")
    assert "out of memory at N=8" in shown and "at most N=6 fit" in shown


def test_a_profile_says_the_cuda_context_its_trials_showed(server: Server) -> None:
    plain = store_profile(server, device_name="NVIDIA T4")
    measured = store_profile(server, device_name="NVIDIA L40S", context_mb=412)
    assert row(gpumux(server, "profiles", str(plain)).stdout, "CUDA").split()[-1] == "-"
    assert row(gpumux(server, "profiles", str(measured)).stdout, "CUDA").split()[-2:] == [
        "412",
        "MiB",
    ]


def test_a_profile_is_drawn_into_a_png(server: Server, tmp_path: Path) -> None:
    profile_id = store_profile(server, device_name="NVIDIA L4")
    path = tmp_path / "curve.png"
    result = gpumux(server, "profiles", str(profile_id), "--png", str(path))
    assert result.returncode == 0, result.stderr
    assert f"wrote {path}" in result.stderr and "aggregate samples/s" in result.stdout
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000


def test_a_pngs_title_fits_inside_the_image_however_long_the_workload(
    server: Server, tmp_path: Path
) -> None:
    image = pytest.importorskip("matplotlib.image", reason="the PNG needs matplotlib")
    profile_id = store_profile(
        server,
        device_name="AMD EPYC 7B13 64-Core Processor",
        workdir="/home/a-newcomer/src/gpumux/experiments/2026-11-26/digits",
        command=["/home/a-newcomer/src/gpumux/.venv/bin/python", "examples/digits_keras.py"]
        + ["--epochs", "10", "--batch-size", "{batch_size}", "--learning-rate", "{lr}"],
        param_tokens=["batch_size=32", "width=128"],
    )
    path = tmp_path / "curve.png"
    assert gpumux(server, "profiles", str(profile_id), "--png", str(path)).returncode == 0

    pixels = image.imread(path)[:, :, :3]
    ink = pixels.min(axis=2) < 0.5
    # The title is what is drawn above the first axes' top edge, a row mostly inked.
    top = next(y for y in range(ink.shape[0]) if ink[y].mean() > 0.5)
    title = ink[:top]
    assert title.any(), "a title is drawn"
    # Text cut at an edge leaves ink within a few pixels of it; a title that fits keeps clear.
    margin = ink.shape[1] // 100
    assert not title[:, :margin].any() and not title[:, -margin:].any(), "clipped at a side"


def test_a_sweeps_profile_is_found_by_the_sweeps_name(server: Server) -> None:
    command = [sys.executable, "-c", "pass"]
    for options in (["--name", "searched"], ["--split", "2", "--name", "fixed"]):
        submitted = gpumux(server, "sweep", "x=1", *options, "--detach", "--", *command)
        assert submitted.returncode == 0, submitted.stderr
    deadline = time.monotonic() + DEADLINE_S
    # The search stores the workload's profile by the time its sweep has ended.
    while (shown := gpumux(server, "profiles", "--sweep", "searched", columns=200)).returncode:
        assert "has no profile" in shown.stderr, shown.stderr
        assert time.monotonic() < deadline, "the sweep's search stored no profile"
        time.sleep(0.2)
    unsearched = gpumux(server, "profiles", "--sweep", "fixed")

    assert row(shown.stdout, "command").split()[1:] == command
    # The sweep runs where it was submitted: this test's directory.
    assert row(shown.stdout, "directory").split()[1:] == [os.getcwd()]
    assert unsearched.returncode == 1
    assert "has no profile: its split was fixed" in unsearched.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["profiles", "999"], 1, "profile 999 not found"),
        (["profiles", "--png", "x.png"], 2, "--png draws one profile"),
        (["profiles", "1", "--sweep", "x"], 2, "a profile's ID or --sweep SWEEP, not both"),
        (["profiles", "--sweep", "nameless"], 1, "no sweep named 'nameless'"),
    ],
)
def test_profile_errors_are_one_line(
    server: Server, args: list[str], code: int, message: str
) -> None:
    result = gpumux(server, *args)
    assert result.returncode == code and message in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
