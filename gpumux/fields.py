"""The bounded field types and limits of the API: what one value of a request may hold (pure)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from gpumux.grammar import sweepspec

# Limits of what a request may hold, part of the schema: each is checked before work is done.
# Command and environment together stay well under the daemon's default body limit (1 MiB).
# Ids, offsets and seeds: what a JSON client holds exactly (JavaScript's Number.MAX_SAFE_INTEGER;
# schema-driven clients compare bounds as doubles), and well inside SQLite's 64-bit INTEGER.
MAX_ID = 2**53 - 1
MAX_COUNT = 2**31 - 1  # attempts, trials, steps
MAX_SPLIT = 64  # trials on one device
MAX_SEARCH_OPTIONS = 20  # a sampler's options: Optuna's samplers take at most a dozen
MAX_NAME_CHARS = 200  # a sweep's name, a metric's name, a pruner (their columns)
MAX_USER_CHARS = 64  # an owner's name (its column)
PATH_MAX = 4096  # Linux's, with the terminating NUL
# Linux's MAX_ARG_STRLEN: the longest single argument or NAME=value an exec accepts.
MAX_ARG_BYTES = 128 * 1024
MAX_COMMAND_WORDS = 1024
MAX_COMMAND_BYTES = 256 * 1024
MAX_ENV_ENTRIES = 4096
MAX_ENV_BYTES = 512 * 1024
MAX_TIME_LIMIT_S = 366 * 86400.0
MAX_SAMPLES = 1e12  # one report's samples
MAX_REPORT_SECONDS = 1e7  # one report's interval (about 116 days)
MAX_UNIX_TIME = 253402300799.0  # 9999-12-31T23:59:59Z, the last moment a datetime holds
MAX_METRICS = 256  # metrics in one report

# The schema's patterns; each is checked by a validator that says what is wrong in words.
NUL_FREE = r"^[^\x00]*$"
# No control character (C0, DEL, C1: escapes, line breaks): text that terminals show as it is.
PRINTABLE = r"^[^\x00-\x1f\x7f-\x9f]*$"
PARAM_TOKEN = r"^[A-Za-z_][A-Za-z0-9_-]*=[^\x00-\x1f\x7f-\x9f]*$"
ABSOLUTE_PATH = r"^/[^\x00]*$"
ENV_NAME = r"^[^=\x00]+$"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def valid_unicode(text: str) -> str:
    """Refuse a lone UTF-16 surrogate (a JSON \\ud800 escape without its pair): it is no text,
    and no answer holding it could be written."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise PydanticCustomError(
            "string_unicode",
            "not valid Unicode: it holds a lone surrogate (\\ud800-\\udfff without its pair); "
            "send UTF-8 text",
        ) from None
    return text


def os_text(text: str) -> str:
    """Valid Unicode without NUL, as what reaches a process's arguments, environment or path."""
    if "\0" in valid_unicode(text):
        raise PydanticCustomError(
            "string_nul", "holds a NUL character, which cannot be passed to a process"
        )
    return text


def names_in_property_names(schema: dict[str, Any]) -> None:
    """A mapping's key rules as JSON Schema's `propertyNames`: pydantic writes a key type's
    pattern as `patternProperties`, which leaves every key that does not match it unchecked."""
    if "patternProperties" in schema:
        # One key type, so one pattern.
        [(pattern, values)] = schema.pop("patternProperties").items()
        schema["additionalProperties"] = values
        schema.setdefault("propertyNames", {}).setdefault("pattern", pattern)


def printable(text: str) -> str:
    """Valid Unicode without control characters: a name, a parameter, an objective, shown in
    every user's and admin's terminal, must not carry escape sequences to it."""
    if _CONTROL.search(valid_unicode(text)):
        raise PydanticCustomError(
            "string_control",
            "holds a control character (an escape, a line break, a tab); write plain text",
        )
    return text


def json_integer(value: object) -> object:
    """An integer as JSON Schema counts one: 3 or 3.0, never true or "3" (pydantic's lax mode
    would take those, its strict mode would refuse 3.0); "auto" passes, for `split`."""
    if value == "auto":
        return value
    if isinstance(value, bool | str | bytes):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def json_number(value: object) -> object:
    """A number as JSON Schema counts one: never true or "0.5"."""
    if isinstance(value, bool | str | bytes):
        raise PydanticCustomError("float_type", "Input should be a valid number")
    return value


_OS = (AfterValidator(os_text), Field(json_schema_extra={"pattern": NUL_FREE}))
# Lengths come first in each type, so that a value too long is refused before it is read.
ParamToken = Annotated[
    str,
    Field(min_length=2, max_length=sweepspec.MAX_TOKEN_CHARS),
    AfterValidator(printable),
    Field(json_schema_extra={"pattern": PARAM_TOKEN}),
]
CommandWord = Annotated[str, Field(max_length=MAX_ARG_BYTES - 1), *_OS]
Workdir = Annotated[
    str,
    Field(min_length=1, max_length=PATH_MAX - 1),
    AfterValidator(os_text),
    Field(json_schema_extra={"pattern": ABSOLUTE_PATH}),
]
EnvName = Annotated[str, Field(min_length=1, max_length=MAX_ARG_BYTES - 2), *_OS]
EnvValue = Annotated[str, Field(max_length=MAX_ARG_BYTES - 3), *_OS]
UserName = Annotated[str, Field(min_length=1, max_length=MAX_USER_CHARS), *_OS]
ShortText = Annotated[
    str,
    Field(max_length=MAX_NAME_CHARS),
    AfterValidator(printable),
    Field(json_schema_extra={"pattern": PRINTABLE}),
]
# NUL-free as the report lines and the runtime keep them: one name, whichever way it came.
MetricName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS), *_OS]
# The metric a sweep ranks its trials by: shown in terminals, so printable too.
ObjectiveMetric = Annotated[
    str,
    Field(min_length=1, max_length=MAX_NAME_CHARS),
    AfterValidator(printable),
    Field(json_schema_extra={"pattern": PRINTABLE}),
]
