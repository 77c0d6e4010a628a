"""What every pipeline-mode controller shares: instances, prompts, dispatch, micro-batches."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from policies.dispatch import DispatchPolicy
from policies.modes.events import (
    Command,
    Dispatch,
    Event,
    InstanceAdded,
    OptimizerStep,
    SampleFinished,
    TrainSamples,
    WeightsLoaded,
)
from policies.protocols import LengthPredictor
from policies.records import Completion, InflightHandling, InstanceView, Request


class PromptSource(Protocol):
    def batch(self, iteration: int) -> list[Request]:
        """The requests of one iteration: batch_size / group_size prompts × group_size."""
        ...


class ScalingRule(Protocol):
    def instances_to_add(
        self, gen_time_s: float, train_time_s: float, num_instances: int
    ) -> int: ...


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    num_steps: int  # optimizer steps in the run
    batch_size: int  # samples per optimizer step
    group_size: int
    micro_batch_samples: int  # samples per trainer micro-batch in streaming modes
    colocated: bool  # generation and training time-share the same GPUs
    streaming: bool  # the trainer consumes samples as they finish
    max_lag: int  # versions a trained sample may lag the trainer
    inflight: InflightHandling  # how instances load weights (BARRIER = between iterations)
    steps_per_wave: int = 1  # optimizer steps per generated batch (``conventional``)


class Controller:
    """Base of the event-driven controllers: ``handle(event) -> commands``, no I/O."""

    def __init__(
        self,
        config: ControllerConfig,
        prompts: PromptSource,
        predictor: LengthPredictor,
        dispatch: DispatchPolicy,
        instances: Sequence[InstanceView],
        scaling: ScalingRule | None = None,
    ) -> None:
        self.config = config
        self._prompts = prompts
        self._predictor = predictor
        self._dispatch = dispatch
        self.views: dict[int, InstanceView] = {v.instance_id: v for v in instances}
        self._scaling = scaling
        self.train_step_of: dict[int, int] = {}  # sample id -> optimizer step that trained it
        self._feed: list[Completion] = []  # placed in the current step, not yet sent
        self.latest_version = 0
        self.finished = False
        self._handlers: dict[type, Callable[[Event], list[Command]]] = {}

    def handle(self, event: Event) -> list[Command]:
        handler = self._handlers.get(type(event))
        if handler is None:
            return []
        return handler(event)

    # -- shared steps ----------------------------------------------------------------

    def _predict(self, requests: list[Request]) -> list[Request]:
        preds = self._predictor.predict(requests)
        return [dataclasses.replace(r, predicted_tokens=p) for r, p in zip(requests, preds)]

    def _dispatch_to(
        self, requests: Sequence[Request], views: Sequence[InstanceView]
    ) -> list[Command]:
        targets = self._dispatch.assign(requests, views)
        by_instance: dict[int, list[Request]] = {}
        for r, instance_id in zip(requests, targets):
            by_instance.setdefault(instance_id, []).append(r)
            view = self.views[instance_id]
            view.num_assigned += 1
            view.assigned_tokens += r.predicted_tokens or 0.0
        return [Dispatch(i, tuple(rs)) for i, rs in sorted(by_instance.items())]

    def _note_finished(self, event: SampleFinished) -> Completion:
        c = event.completion
        view = self.views[c.instance_id]
        view.num_assigned -= 1
        view.assigned_tokens -= c.request.predicted_tokens or 0.0
        return c

    def _train(self, step: int, completion: Completion) -> list[Command]:
        """Put a completion into ``step``; emit a micro-batch when one is full."""
        self.train_step_of[completion.sample_id] = step
        self._feed.append(completion)
        if self.config.streaming and len(self._feed) >= self.config.micro_batch_samples:
            return self._flush(step)
        return []

    def _flush(self, step: int) -> list[Command]:
        if not self._feed:
            return []
        batch, self._feed = tuple(self._feed), []
        return [TrainSamples(step, batch)]

    def _close_step(self, step: int) -> list[Command]:
        return [*self._flush(step), OptimizerStep(step)]

    def _on_weights_loaded(self, event: WeightsLoaded) -> None:
        view = self.views[event.instance_id]
        view.version = max(view.version, event.version)

    def _on_instance_added(self, event: InstanceAdded) -> None:
        self.views[event.view.instance_id] = event.view
