"""What GET /health answers."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class Health(BaseModel):
    status: Literal["ok"]
    version: str
    database: str
    devices: int
    queued_trials: int
    active_trials: int
