"""A sweep file's text to a document: YAML (keys given twice refused) or JSON, and the error
every refusal of a sweep file raises."""

from __future__ import annotations

import json
import os
import stat
from typing import Any

import yaml

from gpumux.text import cut

_MERGE_TAG = "tag:yaml.org,2002:merge"
# Far beyond any sweep file, and beyond what the daemon would take in one request.
MAX_FILE_BYTES = 1024 * 1024
# A refusal quotes what it refuses; a file's values can be long, a terminal line is not.
MAX_MESSAGE_CHARS = 500


class SweepFileError(ValueError):
    """A sweep file gpumux cannot run as written: the file, the key, and what to do."""

    def __init__(self, file: str, key: str, problem: str) -> None:
        message = f"{file}: {key}: {problem}" if key else f"{file}: {problem}"
        super().__init__(cut(message, MAX_MESSAGE_CHARS))
        self.file = file
        self.key = key


class _Loader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice (PyYAML would keep the last silently) and
    any alias: each `*name` repeats a whole subtree, so a few hundred bytes of nested aliases
    expand to billions of values (a "billion laughs")."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None,
                None,
                f"the alias *{event.anchor} is not taken in a sweep file; write its value out",
                event.start_mark,
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                if key_node.value in seen:
                    problem = f"the key {key_node.value!r} is given twice; keep one"
                    raise yaml.constructor.ConstructorError(
                        None, None, problem, key_node.start_mark
                    )
                seen.add(key_node.value)
        return super().construct_mapping(node, deep)


def load(text: str, *, file: str, as_json: bool) -> Any:
    """The document in `text`; SweepFileError with the line and column where it is malformed."""
    if as_json:
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            where = f"line {error.lineno}, column {error.colno}"
            raise SweepFileError(file, where, f"malformed JSON: {error.msg}") from error
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SweepFileError(file, where, f"malformed YAML: {error.problem}") from error
    except yaml.YAMLError as error:
        raise SweepFileError(file, "", f"malformed YAML: {error}") from error


def read_text(file: str) -> str:
    """The text of a sweep file: a regular file or a pipe (`--config <(...)`) of at most
    MAX_FILE_BYTES of UTF-8; anything else (a device, a directory) refused before it is opened."""
    try:
        mode = os.stat(file).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
            raise SweepFileError(file, "", "cannot read it: not a regular file")
        # A FIFO waits here for its writer, as `cat` would.
        with open(file, "rb") as opened:
            data = opened.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise SweepFileError(file, "", f"cannot read it: {error.strerror}") from error
    if len(data) > MAX_FILE_BYTES:
        raise SweepFileError(
            file, "", f"it is over {MAX_FILE_BYTES // 1024:,} KiB; a sweep file is a few lines"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SweepFileError(file, "", "cannot read it: not UTF-8 text") from error
