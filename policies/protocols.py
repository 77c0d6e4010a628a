"""Protocols: the seams between a policy and what it needs to know.

Policies price work through a :class:`CostModel` and rank requests through a
:class:`LengthPredictor`; the simulator and the live runtime each provide
implementations. Generation and training backends meet the pipeline controllers through
events and commands instead (``policies.modes.events``): the simulator's SimPy processes
and the runtime's asyncio tasks feed the same controller and execute its commands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from policies.records import Request


@dataclass(slots=True, frozen=True)
class Device:
    """A group of identical accelerators working as one unit (an instance or a trainer)."""

    hardware: str
    num_gpus: int


@runtime_checkable
class CostModel(Protocol):
    """Time estimates, in seconds, for the operations a pipeline is made of."""

    def decode_step_s(self, device: Device, batch_size: int, context_tokens: int) -> float:
        """One decode step of ``batch_size`` sequences holding ``context_tokens`` in KV."""
        ...

    def prefill_s(self, device: Device, num_tokens: int) -> float: ...

    def train_s(self, device: Device, num_tokens: int, num_micro_batches: int = 1) -> float:
        """Forward and backward of the algorithm's models over ``num_tokens`` tokens, run
        as ``num_micro_batches`` micro-batches (calls) on each of ``device``'s GPUs."""
        ...

    def weight_transfer_s(self, num_bytes: float, gbps: float, latency_s: float) -> float: ...


@runtime_checkable
class LengthPredictor(Protocol):
    """Predicts output length (tokens) of requests; only the ranking must be good."""

    def fit(self, requests: Sequence[Request], output_tokens: Sequence[int]) -> None: ...

    def predict(self, requests: Sequence[Request]) -> list[float | None]: ...


@runtime_checkable
class OnlineLengthPredictor(LengthPredictor, Protocol):
    """A predictor that learns from finished samples while the run goes on (the ranker);
    ``update`` must return at once (refits happen in the background)."""

    def update(self, requests: Sequence[Request], output_tokens: Sequence[int]) -> None: ...


@runtime_checkable
class HistoryLengthPredictor(LengthPredictor, Protocol):
    """A predictor whose features include the lengths of the samples finished so far (the
    ranker): the simulator ``record``s each sample as it finishes, so that a request sees
    only what had finished when it was dispatched; ``record`` never refits."""

    def record(self, requests: Sequence[Request], output_tokens: Sequence[int]) -> None: ...
