"""What every pipeline-mode controller shares: instances, prompts, dispatch, micro-batches;
and the registry of modes, each a controller class with its traits."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

from policies.dispatch import DispatchPolicy
from policies.modes.events import (
    Command,
    Dispatch,
    Event,
    InstanceAdded,
    InstanceLost,
    InstanceRetired,
    OptimizerStep,
    SampleFinished,
    ScaleIn,
    TrainSamples,
    WeightsLoaded,
)
from policies.protocols import LengthPredictor
from policies.records import Completion, InflightHandling, InstanceView, Request
from policies.registry import Registry

DEFAULT_MAX_LAG = 4  # ``pipeline.max_lag`` of the ``pipeline`` mode when the spec leaves it unset


class PromptSource(Protocol):
    def batch(self, iteration: int) -> list[Request]:
        """The requests of one iteration: batch_size / group_size prompts × group_size."""
        ...


@runtime_checkable
class ScalingRule(Protocol):
    """Elastic generation's decision after an iteration; ``time_s`` is when it is made (in
    the run's clock), for the rule's log."""

    def instances_to_add(
        self, gen_time_s: float, train_time_s: float, num_instances: int, *, time_s: float
    ) -> int: ...

    def instances_to_retire(
        self, gen_time_s: float, train_time_s: float, num_instances: int, *, time_s: float
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
    push_every: int = 1  # continuous modes: optimizer steps per weight push
    overlap_waves: bool = False  # one-step async modes: a batch starts before the last ends


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
        self.retiring: dict[int, InstanceView] = {}  # asked to retire: finishing, no new work
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
        return [r.with_prediction(p) for r, p in zip(requests, preds)]

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
        view = self.views.get(c.instance_id) or self.retiring[c.instance_id]
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
        view = self.views.get(event.instance_id)
        if view is not None:  # None: the instance was lost meanwhile
            view.version = max(view.version, event.version)

    def _on_instance_added(self, event: InstanceAdded) -> None:
        self.views[event.view.instance_id] = event.view

    def _retire(self, count: int) -> list[Command]:
        """Retire the ``count`` newest instances (never the last one): no more requests
        go to them; their view stays until ``InstanceRetired``."""
        ids = sorted(self.views)[-count:] if 0 < count < len(self.views) else []
        for i in ids:
            self.retiring[i] = self.views.pop(i)
        return [ScaleIn(tuple(ids))] if ids else []

    def _on_instance_retired(self, event: InstanceRetired) -> None:
        self.retiring.pop(event.instance_id, None)

    def _on_instance_lost(self, event: InstanceLost) -> list[Command]:
        """Forget the instance; send the requests it was running to the others (the same
        requests: sample ids, groups and iterations stay theirs)."""
        self.views.pop(event.instance_id, None)
        self.retiring.pop(event.instance_id, None)
        if not event.requests or not self.views:
            return []
        return self._dispatch_to(list(event.requests), self._resubmit_views())

    def _resubmit_views(self) -> list[InstanceView]:
        """Where requests dispatched again may go (every instance; a mode may narrow it)."""
        return list(self.views.values())


C = TypeVar("C", bound=type[Controller])


@dataclass(frozen=True, slots=True)
class ModeTraits:
    """A pipeline mode: the controller class that runs it and what it fixes.

    ``max_lag`` is the staleness bound a mode fixes; None where the spec sets it
    (``pipeline.max_lag`` for a ``continuous`` mode, ``steps_per_generation − 1`` for a
    ``conventional`` one)."""

    name: str
    controller: type[Controller]
    colocated: bool = False  # generation and training time-share every GPU
    streaming: bool = False  # the trainer consumes samples as they finish
    max_lag: int | None = None
    continuous: bool = False  # PipelineRL-style: weights load in flight (pipeline.inflight)
    conventional: bool = False  # G optimizer steps per generated batch of G·B samples

    def fixed_lag(self, steps_per_generation: int) -> int | None:
        """The bound this mode fixes; None when ``pipeline.max_lag`` sets it."""
        return steps_per_generation - 1 if self.conventional else self.max_lag

    def stages_overlap(self, bound: int) -> bool:
        """Whether generation and training run at once under staleness ``bound``: a
        streaming trainer trains while its batch generates, a bound above 0 lets the next
        batch generate while this one trains. Otherwise an iteration takes the two stage
        times in turn, as ``conventional`` does whatever its bound (its G steps train
        what one set of weights generated, and generation waits for all G)."""
        if self.colocated or self.conventional:
            return False
        return self.streaming or bound > 0

    def staleness_bound(self, max_lag: int | None, steps_per_generation: int) -> int:
        """The bound a run of this mode keeps, given ``pipeline.max_lag`` (None: unset);
        a lag this mode does not take is an error."""
        fixed = self.fixed_lag(steps_per_generation)
        if fixed is None:
            return DEFAULT_MAX_LAG if max_lag is None else max_lag
        if max_lag is not None and max_lag != fixed:
            raise ValueError(
                f"{max_lag} does not apply to mode {self.name!r}, whose bound is fixed at "
                f"{fixed}; leave pipeline.max_lag unset (it sets the lag of mode 'pipeline')"
            )
        return fixed


MODES: Registry[ModeTraits] = Registry("mode")


def register_mode(name: str, **traits: bool | int) -> Callable[[C], C]:
    """Class decorator: ``name`` is run by this controller class with these traits."""

    def add(cls: C) -> C:
        MODES.register(name)(ModeTraits(name, cls, **traits))  # type: ignore[arg-type]
        return cls

    return add
