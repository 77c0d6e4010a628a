"""Scheduling inside a generation instance: the order in which waiting requests are admitted."""

from __future__ import annotations

from typing import Protocol

from policies.records import Request
from policies.registry import Factories, Registry


class SchedulingPolicy(Protocol):
    def priority(self, request: Request) -> float:
        """Smaller is admitted first; ties keep arrival order."""
        ...


SCHEDULING: Factories[SchedulingPolicy] = Registry("scheduling")


@SCHEDULING.register("fcfs")
class FcfsScheduling:
    """First come, first served (vLLM's default)."""

    def priority(self, request: Request) -> float:
        return 0.0


@SCHEDULING.register("lpt")
class LptScheduling:
    """Longest predicted output first (StreamRL); unknown predictions go last, in order."""

    def priority(self, request: Request) -> float:
        return -(request.predicted_tokens or 0.0)
