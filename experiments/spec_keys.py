"""Every key of a run spec with its type, default and description (``tandem spec keys``).

Read from the pydantic models of :mod:`policies.spec`, so the list cannot drift from
what the spec accepts; a key whose values are a registry's names (``pipeline.mode``,
``policies.dispatch``...) lists those names, read from the registry. List items are
written ``N`` (``cluster.generation.N.tp``); their defaults are those of one new item.
"""

from __future__ import annotations

import enum
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from policies.registry import Registry
from policies.spec import RunSpec


@dataclass(frozen=True, slots=True)
class SpecKey:
    key: str  # dotted path, list items as N
    type: str
    default: Any
    description: str | None


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _model_of(annotation: Any) -> tuple[type[BaseModel] | None, str]:
    """(the section model inside ``annotation``, how: "section", "list" or "optional")."""
    if _is_section(annotation):
        return annotation, "section"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list and len(args) == 1 and _is_section(args[0]):
        return args[0], "list"
    if origin in (typing.Union, types.UnionType):
        models = [a for a in args if a is not type(None)]
        if len(models) == 1 and len(args) == 2 and _is_section(models[0]):
            return models[0], "optional"
    return None, "value"


def type_name(annotation: Any) -> str:
    """A short readable type: ``int``, ``float | None``, ``one of: a, b``."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "one of: " + ", ".join(str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of: " + ", ".join(str(m.value) for m in annotation)
    if annotation is type(None):
        return "None"
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(annotation))
        return f"{origin.__name__}[{args}]"
    return getattr(annotation, "__name__", str(annotation))


def field_type(field: FieldInfo) -> str:
    """``type_name`` of the field; a name from a registry (the registry in its annotation,
    ``Annotated[str, MODES]``) as ``one of:`` the registry's names."""
    registries = [m for m in field.metadata if isinstance(m, Registry)]
    if registries:
        return "one of: " + ", ".join(registries[0].names())
    return type_name(field.annotation)


def _default(field: FieldInfo) -> Any:
    if field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    else:
        return None
    return value.value if isinstance(value, enum.Enum) else value


def spec_keys(model: type[BaseModel] = RunSpec, prefix: str = "") -> list[SpecKey]:
    """Every leaf key of ``model``. A list of sections, or a section that may be None,
    is listed itself and then with each of its keys."""
    out: list[SpecKey] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        section, how = _model_of(field.annotation)
        if section is None or how == "optional":
            kind = field_type(field)
            out.append(SpecKey(key, kind, _default(field), field.description))
        if section is None:
            continue
        if how == "list":
            default = [item.model_dump(mode="json") for item in _default(field)]
            out.append(SpecKey(key, f"list[{section.__name__}]", default, field.description))
        out += spec_keys(section, f"{key}.N." if how == "list" else f"{key}.")
    return out
