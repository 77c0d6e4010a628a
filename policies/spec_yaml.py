"""YAML as a spec reads it — safe types only, a key given twice is an error — and the
``key.path=value`` overrides of the command line."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from policies.spec_fields import NULL_WORDS, field_annotation, takes_none, takes_text


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


def read_yaml(text: str, model: type[BaseModel] | None = None) -> Any:
    """YAML as a spec reads it: safe types, duplicate keys an error; with ``model``, an
    unquoted value of a key that holds text stays the text written (``name: 007`` is
    ``"007"``, where YAML reads the number 7; ``datacenter: no`` is ``"no"``, not false)."""
    loader = UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if model is not None:
            _keep_text(node, [], model)
        return loader.construct_document(node)
    finally:
        loader.dispose()


_TEXT_TAG = "tag:yaml.org,2002:str"
_NULL_TAG = "tag:yaml.org,2002:null"


def _keep_text(node: yaml.Node, path: list[str], model: type[BaseModel]) -> None:
    """Tag each plain scalar at a text field of ``model`` as text (a null stays null)."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                _keep_text(value_node, [*path, key_node.value], model)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _keep_text(item, [*path, str(i)], model)
    elif node.tag not in (_TEXT_TAG, _NULL_TAG) and node.style is None:
        annotation = field_annotation(model, path)
        if annotation is not None and takes_text(annotation):
            node.tag = _TEXT_TAG


def parse_override(text: str, model: type[BaseModel] | None = None) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value``; the value is read as YAML (numbers, bools, lists), or, for a
    key of ``model`` that holds text, taken as typed (:func:`read_value`)."""
    if "=" not in text:
        raise SpecError(f"override {text!r} must look like key.path=value")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise SpecError(f"override {text!r} has an empty key")
    try:
        return path, read_value(raw, path, model)
    except yaml.YAMLError as err:
        raise SpecError(f"override {text!r}: not valid YAML ({err})") from None


def read_value(raw: str, path: Sequence[str], model: type[BaseModel] | None) -> Any:
    """``raw`` as YAML; as the text typed where ``path`` names a text field of ``model``
    (``007`` stays ``007``): only a YAML-quoted value is unquoted, and a YAML null
    (``null``, ``~``, nothing) unsets a key that may be None."""
    annotation = None if model is None else field_annotation(model, path)
    if annotation is None or not takes_text(annotation):
        return read_yaml(raw)
    if takes_none(annotation) and raw.strip() in NULL_WORDS:
        return None
    quoted = raw.strip()
    if len(quoted) >= 2 and quoted[0] == quoted[-1] and quoted[0] in "'\"":
        with contextlib.suppress(yaml.YAMLError):
            if isinstance(unquoted := read_yaml(quoted), str):
                return unquoted
    return raw


def given_texts(overrides: Sequence[str]) -> dict[str, str]:
    """Each override's key and its value as typed (for error messages)."""
    pairs = (text.split("=", 1) for text in overrides if "=" in text)
    return {".".join(p for p in key.strip().split(".") if p): raw for key, raw in pairs}


def format_errors(err: ValidationError, given: dict[str, str] | None = None) -> str:
    """A pydantic error as ``key: what is wrong`` lines joined by ``; ``; a key of ``given``
    (an override) shows its value as typed, and text YAML read as another type says so."""
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<spec>"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif e["type"] == "string_type" and isinstance(e["input"], int | float | bool):
            kind = "boolean" if isinstance(e["input"], bool) else "number"
            msg += f" (YAML read it as the {kind} {e['input']!r}: quote it to keep it as text)"
        if given and key in given and repr(given[key]) not in msg:  # as typed, once
            msg += f" (given: {given[key]})"
        lines.append(f"{key}: {msg}")
    return "; ".join(lines)


def apply_overrides(
    data: dict[str, Any], overrides: list[str], model: type[BaseModel] | None = None
) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``key.path=value`` override set (values read
    as :func:`parse_override` reads them for ``model``)."""
    data = copy.deepcopy(data)
    for text in overrides:
        path, value = parse_override(text, model)
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
