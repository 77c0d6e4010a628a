"""YAML as a spec reads it — safe types only, a key given twice is an error — and the
``key.path=value`` overrides of the command line."""

from __future__ import annotations

import copy
from typing import Any

import yaml


class SpecError(ValueError):
    """A spec that cannot be run; the message names the offending key."""


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping holding one key twice (PyYAML keeps the
    last one silently, so a spec's second ``iterations:`` would win unseen)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in first_line:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (line {line}; first on line "
                    f"{first_line[key]})", key_node.start_mark,
                )  # fmt: skip
            first_line[key] = line
        return super().construct_mapping(node, deep)


def read_yaml(text: str) -> Any:
    """YAML as a spec reads it: safe types, duplicate keys an error."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value``; the value is read as YAML (numbers, bools, lists)."""
    if "=" not in text:
        raise SpecError(f"override {text!r} must look like key.path=value")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise SpecError(f"override {text!r} has an empty key")
    try:
        return path, read_yaml(raw)
    except yaml.YAMLError as err:
        raise SpecError(f"override {text!r}: not valid YAML ({err})") from None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``key.path=value`` override set."""
    data = copy.deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        node: Any = data
        for i, part in enumerate(path[:-1]):
            node = _child(node, part, ".".join(path[: i + 1]))
        _set_child(node, path[-1], value, ".".join(path))
    return data


def _child(node: Any, part: str, key: str) -> Any:
    if isinstance(node, list):
        if not part.isdigit() or int(part) >= len(node):
            raise SpecError(f"{key}: no list element {part!r}")
        return node[int(part)]
    if not isinstance(node, dict):
        raise SpecError(f"{key}: cannot set a key inside a value")
    if node.get(part) is None:  # an unset section (model.shape): set key by key
        node[part] = {}
    return node[part]


def _set_child(node: Any, part: str, value: Any, key: str) -> None:
    if isinstance(node, list):
        if not part.isdigit() or int(part) >= len(node):
            raise SpecError(f"{key}: no list element {part!r}")
        node[int(part)] = value
    elif isinstance(node, dict):
        node[part] = value
    else:
        raise SpecError(f"{key}: cannot set a key inside a value")
