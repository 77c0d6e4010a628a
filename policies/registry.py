"""Registries: each policy family maps names to factories; duplicate names raise."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A name → factory map for one policy family (dispatch, scheduling, ...)."""

    def __init__(self, family: str) -> None:
        self.family = family
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        def add(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._factories:
                raise ValueError(f"{self.family} policy {name!r} is already registered")
            self._factories[name] = factory
            return factory

        return add

    def names(self) -> list[str]:
        return sorted(self._factories)

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def create(self, name: str, **kwargs: object) -> T:
        if name not in self._factories:
            raise ValueError(
                f"unknown {self.family} policy {name!r}; choose one of {', '.join(self.names())}"
            )
        return self._factories[name](**kwargs)
