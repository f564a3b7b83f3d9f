"""The data directory (GPUMUX_HOME, 0700): every file gpumux keeps in it, named here only.

gpumux.sock      the daemon's Unix socket (when GPUMUX_URL names no other)
gpumux.db        the SQLite database (when GPUMUX_DB names no other), `gpumux.db.lock` beside
daemon.lock      held by the one daemon that uses this directory
database.lock    held by this node's daemon on a database kept by a server (PostgreSQL)
token            the daemon's own user's API token
node-id          this directory's random id: its node across restarts and renames
node.lease       until when this node holds its lease on a shared database
logs/sweep-S/trial-T.A.log   each trial attempt's output
runs/T.A/        each trial attempt's run directory (processes/rundir.py names its files)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Layout:
    """The paths of one data directory."""

    home: Path

    @property
    def socket(self) -> Path:
        return self.home / "gpumux.sock"

    @property
    def database(self) -> Path:
        return self.home / "gpumux.db"

    @property
    def daemon_lock(self) -> Path:
        return self.home / "daemon.lock"

    @property
    def database_lock(self) -> Path:
        return self.home / "database.lock"

    @property
    def daemon_token(self) -> Path:
        return self.home / "token"

    @property
    def node_id(self) -> Path:
        return self.home / "node-id"

    @property
    def node_lease(self) -> Path:
        return self.home / "node.lease"

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    @property
    def runs(self) -> Path:
        return self.home / "runs"

    def make(self) -> None:
        """The directory and its logs and runs, owner only (the database holds each
        submitter's environment, the logs their output); OSError where they cannot be made."""
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.logs.mkdir(mode=0o700, exist_ok=True)
        self.runs.mkdir(mode=0o700, exist_ok=True)

    def trial_log(self, *, sweep_id: int, trial_id: int, attempt: int) -> Path:
        """One attempt's output, grouped by sweep."""
        return self.logs / f"sweep-{sweep_id}" / f"trial-{trial_id}.{attempt}.log"
