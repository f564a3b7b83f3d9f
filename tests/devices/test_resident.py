"""Resident memory read from /proc, the measure of a trial on the CPU device."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpumux.devices.resident import resident_mb

HELD_MB = 96


@pytest.fixture
def holder() -> Iterator[subprocess.Popen[str]]:
    """A process holding HELD_MB of memory it has written, until its stdin closes."""
    script = (
        "import sys\n"
        f"held = b'x' * ({HELD_MB} << 20)\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        yield child


def test_a_process_holding_memory_reads_as_holding_it(holder: subprocess.Popen[str]) -> None:
    alone = resident_mb([os.getpid()])
    held = resident_mb([holder.pid])
    assert alone is not None and held is not None
    assert HELD_MB <= held < HELD_MB + 200
    assert resident_mb([os.getpid(), holder.pid]) == pytest.approx(alone + held, abs=2)


def test_processes_that_are_gone_count_for_nothing() -> None:
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    gone = int(ended.stdout)
    assert resident_mb([]) is None
    assert resident_mb([gone]) is None
    mine = resident_mb([os.getpid(), gone])
    assert mine is not None and mine == pytest.approx(resident_mb([os.getpid()]), abs=2)


def test_statm_is_read_in_pages(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "statm").write_text("9000 2048 100 10 0 500 0\n")
    page = os.sysconf("SC_PAGE_SIZE")
    assert resident_mb([42], proc=tmp_path) == 2048 * page // 2**20
