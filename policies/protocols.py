"""Protocols: the seams between a policy and what executes it.

The simulator (``sim``) and the live runtime (``runtime``) each provide
implementations; the policies and pipeline controllers are written against these.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from policies.records import Completion, InflightHandling, Request, StepStats, TrainBatch


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

    def train_s(self, device: Device, num_tokens: int) -> float:
        """Forward and backward of the algorithm's models over ``num_tokens`` tokens."""
        ...

    def weight_transfer_s(self, num_bytes: float, gbps: float, latency_s: float) -> float: ...


@runtime_checkable
class LengthPredictor(Protocol):
    """Predicts output length (tokens) of requests; only the ranking must be good."""

    def fit(self, requests: Sequence[Request], output_tokens: Sequence[int]) -> None: ...

    def predict(self, requests: Sequence[Request]) -> list[float | None]: ...


@runtime_checkable
class GenerationBackend(Protocol):
    """A generation instance: takes requests, streams completions, loads new weights."""

    async def submit(self, request: Request) -> None: ...

    def completions(self) -> AsyncIterator[Completion]: ...

    async def update_weights(self, version: int, inflight: InflightHandling) -> float:
        """Load weights ``version``; returns the pause (seconds) generation saw."""
        ...


@runtime_checkable
class TrainBackend(Protocol):
    """A trainer: consumes batches, takes optimizer steps, exports weights."""

    async def consume(self, batch: TrainBatch) -> None: ...

    async def step(self, step: int) -> StepStats: ...

    async def export_weights(self, version: int) -> None: ...
