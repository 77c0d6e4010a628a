"""Registries: each policy family maps names to entries; duplicate names raise.

An entry is a factory (dispatch, scheduling, length predictor, allocation: ``create``
calls it) or a record (a pipeline mode's :class:`~policies.modes.base.ModeTraits`:
``get`` returns it). Factories name the arguments they take — no ``**kwargs``
catch-all — so an argument a factory does not take is an error naming it, never
silently dropped; the builder (``policies.build``) hands each factory, by name, the
inputs it asks for (:meth:`Registry.create_from`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Generic, TypeAlias, TypeVar

E = TypeVar("E")
R = TypeVar("R")
T = TypeVar("T")


class Registry(Generic[E]):
    """A name → entry map for one policy family (dispatch, scheduling, ...)."""

    def __init__(self, family: str) -> None:
        self.family = family
        self._entries: dict[str, E] = {}

    def register(self, name: str) -> Callable[[E], E]:
        def add(entry: E) -> E:
            if name in self._entries:
                raise ValueError(f"{self.family} policy {name!r} is already registered")
            self._entries[name] = entry
            return entry

        return add

    def names(self) -> list[str]:
        return sorted(self._entries)

    def items(self) -> list[tuple[str, E]]:
        return sorted(self._entries.items())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str) -> E:
        if name not in self._entries:
            raise ValueError(
                f"unknown {self.family} policy {name!r}; choose one of {', '.join(self.names())}"
            )
        return self._entries[name]

    def create(self: Registry[Callable[..., R]], name: str, **kwargs: object) -> R:
        """Call the factory of ``name`` with ``kwargs``; one it does not take is an error."""
        factory = self.get(name)
        try:
            inspect.signature(factory).bind_partial(**kwargs)
        except TypeError as err:
            raise ValueError(f"{self.family} policy {name!r}: {err}") from None
        return factory(**kwargs)

    def create_from(
        self: Registry[Callable[..., R]], name: str, offered: Mapping[str, object]
    ) -> R:
        """Call the factory of ``name`` with the offered inputs it names, by name.

        A parameter nothing offers (a misspelled knob, an input the builder does not
        know) is an error naming it, even when it has a default."""
        factory = self.get(name)
        missing = [p for p in named_parameters(factory) if p not in offered]
        if missing:
            raise ValueError(
                f"{self.family} policy {name!r} takes {', '.join(map(repr, missing))}, which "
                f"nothing offers; the builder offers {', '.join(sorted(offered))}"
            )
        return factory(**{p: offered[p] for p in named_parameters(factory)})


def named_parameters(factory: Callable[..., object]) -> list[str]:
    """The parameters of a factory (a function or a class), which must name every one."""
    params = inspect.signature(factory).parameters.values()
    if any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in params):
        raise TypeError(f"{factory!r}: a registered factory names its arguments (no *args/**kw)")
    return [p.name for p in params]


Factories: TypeAlias = Registry[Callable[..., T]]  # a family of factories of T
