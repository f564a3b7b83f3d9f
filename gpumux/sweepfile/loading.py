"""A sweep file's text to a document: YAML (keys given twice refused) or JSON, and the error
every refusal of a sweep file raises."""

from __future__ import annotations

import json
from typing import Any

import yaml

_MERGE_TAG = "tag:yaml.org,2002:merge"


class SweepFileError(ValueError):
    """A sweep file gpumux cannot run as written: the file, the key, and what to do."""

    def __init__(self, file: str, key: str, problem: str) -> None:
        super().__init__(f"{file}: {key}: {problem}" if key else f"{file}: {problem}")
        self.file = file
        self.key = key


class _Loader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice (PyYAML would keep the last silently)."""

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
