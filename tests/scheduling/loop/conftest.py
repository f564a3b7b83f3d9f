"""The loop tests' harness, and the processes a failed test leaves behind killed at its end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from builders import kill_processes_naming

from gpumux.config import Settings
from gpumux.storage.engine import Sessions

from .support import Harness


@pytest.fixture
def harness(settings: Settings, sessions: Sessions, tmp_path: Path) -> Harness:
    return Harness(settings, sessions, tmp_path)


@pytest.fixture(autouse=True)
def no_strays(tmp_path: Path) -> Iterator[None]:
    """Whatever a failed test leaves running (supervisors, trials) is killed at its end."""
    yield
    kill_processes_naming(tmp_path)
