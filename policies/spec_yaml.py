"""YAML as a spec reads it: safe types only, and a key given twice is an error."""

from __future__ import annotations

from typing import Any

import yaml


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
