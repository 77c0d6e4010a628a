"""Scheduling inside a generation instance: the order in which waiting requests are admitted."""

from __future__ import annotations

from typing import Protocol

from policies.cluster import MAX_TOKENS
from policies.records import Request
from policies.registry import Factories, Registry

# a priority step per iteration, above any output length (vLLM's priority is an int)
_ITERATION_STRIDE = 2**24
assert _ITERATION_STRIDE > MAX_TOKENS


class SchedulingPolicy(Protocol):
    def priority(self, request: Request) -> float:
        """Smaller is admitted first; ties keep arrival order."""
        ...


SCHEDULING: Factories[SchedulingPolicy] = Registry("scheduling")
# schedulings whose priority reads a request's ``predicted_tokens``; under any other the
# length predictor changes nothing here (tests/test_length_readers.py checks each one)
READS_LENGTHS = frozenset({"lpt"})


@SCHEDULING.register("fcfs")
class FcfsScheduling:
    """First come, first served (vLLM's default)."""

    def priority(self, request: Request) -> float:
        return 0.0


@SCHEDULING.register("lpt")
class LptScheduling:
    """Longest predicted output first (StreamRL) within a batch, older batches first;
    unknown predictions go last in their batch, in order.

    StreamRL orders one batch's requests. Where batches overlap on an instance
    (``pipeline`` mode, ``overlap_waves``) the next optimizer step needs the oldest, so a
    later batch's long requests must not hold the older batch's short ones in the queue
    (nor preempt them): ordered by length alone, ``streamrl-7b`` at ``pipeline.max_lag`` 4
    (five batches started at once) ended its first step at 43.3 s against 30.1 s at lag 1.
    """

    def priority(self, request: Request) -> float:
        predicted = min(request.predicted_tokens or 0.0, request.max_tokens)
        return request.iteration * _ITERATION_STRIDE - predicted
