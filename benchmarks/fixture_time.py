"""A pytest plugin that prints how long the `sessions` fixture took to set up, all tests
together (each test's database, docs/benchmarks.md "The test suite").

    PYTHONPATH=benchmarks .venv/bin/pytest -p fixture_time tests/storage/test_store.py
"""

from __future__ import annotations

import time
from collections.abc import Generator

import pytest

FIXTURE = "sessions"
spent = {"seconds": 0.0, "setups": 0}


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[object]) -> Generator[None, object, object]:
    start = time.perf_counter()
    try:
        return (yield)
    finally:
        if fixturedef.argname == FIXTURE:
            spent["seconds"] += time.perf_counter() - start
            spent["setups"] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.write_line(
        f"{FIXTURE} fixture setups: {spent['setups']}, total {spent['seconds']:.1f} s"
    )
