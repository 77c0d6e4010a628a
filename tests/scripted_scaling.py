"""Scripted elastic scaling rules for tests of the executors' scale-out and retirement:
:class:`AddThenRetire` adds one instance at the first decision, then retires the newest at
the second decision after the addition has arrived; :class:`AlwaysAddOne` asks for one
more at every decision, :class:`AlwaysAddTwo` for two. Registered on demand (not at import, so that tests that
list the registered allocations at collection do not see it)."""

from __future__ import annotations

from policies.allocation import ALLOCATION

NAME = "test-add-then-retire"


class AddThenRetire:
    def __init__(self) -> None:
        self.base: int | None = None  # instances at the first decision
        self.decisions_with_added = 0

    def allocate(self, cluster, model):  # noqa: ANN001, ANN201 - the allocation protocol
        return cluster

    def instances_to_add(
        self, gen_time_s: float, train_time_s: float, num_instances: int, *, time_s: float
    ) -> int:
        if self.base is None:
            self.base = num_instances
        return 1 if num_instances == self.base and not self.decisions_with_added else 0

    def instances_to_retire(
        self, gen_time_s: float, train_time_s: float, num_instances: int, *, time_s: float
    ) -> int:
        added = self.base is not None and num_instances == self.base + 1
        self.decisions_with_added += added
        return 1 if added and self.decisions_with_added == 2 else 0


def register() -> str:
    """Register the rule (once); its allocation name."""
    if NAME not in ALLOCATION.names():
        ALLOCATION.register(NAME)(AddThenRetire)
    return NAME


ALWAYS_ADD = "test-always-add-one"


class AlwaysAddOne:
    """Asks for one more instance at every decision, never retires one."""

    num_instances = 1

    def allocate(self, cluster, model):  # noqa: ANN001, ANN201 - the allocation protocol
        return cluster

    def instances_to_add(
        self, gen_time_s: float, train_time_s: float, num_instances: int, *, time_s: float
    ) -> int:
        return self.num_instances

    def instances_to_retire(
        self, gen_time_s: float, train_time_s: float, num_instances: int, *, time_s: float
    ) -> int:
        return 0


class AlwaysAddTwo(AlwaysAddOne):
    """Asks for two more instances at every decision (one ``ScaleOut`` of two)."""

    num_instances = 2


def register_always_add(num_instances: int = 1) -> str:
    """Register :class:`AlwaysAddOne` or :class:`AlwaysAddTwo` (once); its allocation name."""
    rule = {1: AlwaysAddOne, 2: AlwaysAddTwo}[num_instances]
    name = f"{ALWAYS_ADD}-{num_instances}" if num_instances > 1 else ALWAYS_ADD
    if name not in ALLOCATION.names():
        ALLOCATION.register(name)(rule)
    return name
