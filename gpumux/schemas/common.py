"""Shapes several resources use: every error answer, the frameworks that may see no GPU."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class FieldProblem(BaseModel):
    """One reason a request was refused: where in the request, and what is wrong there."""

    loc: list[str | int] = Field(description="where: body, query, path or header, then the field")
    msg: str
    type: str = Field(description="the kind of problem, e.g. too_long, finite_number, value_error")


class Problem(BaseModel):
    """Every error answer has this shape: one line that says what went wrong and what to do,
    and for a refused request each field at fault (the value itself is never echoed)."""

    detail: str
    errors: list[FieldProblem] = Field(default_factory=list)


# The frameworks whose runtime hook reports that it sees no GPU (gpumux.runtime.frameworks).
NoGpuFramework = Literal["tensorflow", "torch"]
