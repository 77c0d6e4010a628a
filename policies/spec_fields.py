"""Which spec keys hold text, found by walking the pydantic models along a dotted path.

``--set`` (and a sweep's ``--grid``) read a value as YAML, so numbers, booleans and lists
arrive typed; a key whose field can only hold text (``str``, a ``Literal`` of strings, a
``str`` enum, each possibly ``None``) takes the text as typed instead: ``run.name=007``
stays ``007`` (YAML: the number 7), ``cluster.generation.0.datacenter=no`` stays ``no``
(YAML: false). A value quoted in YAML (``'007'``) is still unquoted, so a sweep's points,
written back as YAML, and the old ``--set "run.name='007'"`` give the same text. A spec
file's unquoted values of such keys are kept as written the same way
(``policies.spec_yaml.read_yaml``).
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

NULL_WORDS = frozenset({"", "~", "null", "Null", "NULL"})  # YAML's nulls: unset an optional key


def field_annotation(model: type[BaseModel], path: Sequence[str]) -> Any | None:
    """The annotation of the field ``path`` names inside ``model`` (list items by index,
    dict values by key); None where the path leaves the models (an unknown key)."""
    annotation: Any = model
    for part in path:
        annotation = _child(_without_none(annotation), part)
        if annotation is None:
            return None
    return annotation


def takes_text(annotation: Any) -> bool:
    """Whether every value the field takes, but None, is text."""
    members = [a for a in _members(annotation) if a is not type(None)]
    return bool(members) and all(_is_text(a) for a in members)


def takes_none(annotation: Any) -> bool:
    return type(None) in _members(annotation)


def _members(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _without_none(annotation: Any) -> Any:
    """``X | None`` as ``X`` (a section that may be unset); anything else as it is."""
    members = [a for a in _members(annotation) if a is not type(None)]
    return members[0] if len(members) == 1 else annotation


def _child(annotation: Any, part: str) -> Any | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        field = annotation.model_fields.get(part)
        return None if field is None else field.annotation
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list and args and part.isdigit():
        return args[0]
    if origin is dict and len(args) == 2:
        return args[1]
    return None


def _is_text(annotation: Any) -> bool:
    if typing.get_origin(annotation) is typing.Literal:
        return all(isinstance(v, str) for v in typing.get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return all(isinstance(m.value, str) for m in annotation)
    return annotation is str
