"""API tokens: asking for one, the one created, the ones revoked."""

from __future__ import annotations

from pydantic import BaseModel, Field

from gpumux.fields import (
    UserName,
)


class TokenCreate(BaseModel):
    user: UserName | None = Field(default=None, description="whose token (default: yours)")


class TokenCreated(BaseModel):
    user: str
    token: str = Field(description="shown once: only its hash is stored")


class TokensRevoked(BaseModel):
    user: str
    revoked: int
