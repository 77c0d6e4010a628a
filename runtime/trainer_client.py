"""What the actor loop calls on the trainer, wherever it runs (:class:`TrainerClient`), and
what a weight push answers (:class:`PushResult`): one process
(:class:`runtime.trainer_proc.TrainerProcess`) or M ranks on Ray
(``runtime.ray_handles.RayTrainerGroup``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from policies.records import StepStats
from runtime.fan_out import ServerAddr
from runtime.recorder import DataPosition
from runtime.trainer import TrainItem


@dataclass(slots=True, frozen=True)
class PushResult:
    version: int
    pause_s: list[float]  # per server, the pause its generation saw (0 where it failed)
    stages_ms: list[dict[str, float]]  # per server: receive / check / load durations
    failures: dict[int, str] = field(default_factory=dict)  # server index -> why it failed


class TrainerClient(Protocol):
    """What the actor loop calls on the trainer, wherever it runs: one process
    (``runtime.trainer_proc.TrainerProcess``) or M ranks on Ray (``runtime.ray_handles.RayTrainerGroup``)."""

    @property
    def pid(self) -> int | None: ...
    async def initialise(self, checkpoint: str | None) -> DataPosition | None: ...
    async def join_group(
        self, servers: list[ServerAddr], host: str, port: int, backend: str
    ) -> None: ...
    async def push_weights(self, version: int) -> PushResult: ...
    async def send_weights(self, version: int) -> None: ...
    async def push_answers(self) -> PushResult: ...
    async def train(self, items: list[TrainItem], now_s: float) -> float: ...
    def generation_idle(self, idle: bool) -> None: ...
    async def step(self, step: int, now_s: float) -> StepStats: ...
    async def checkpoint(self, path: str, position: DataPosition) -> None: ...
    async def checksums(self) -> dict[str, tuple[float, float]]: ...
