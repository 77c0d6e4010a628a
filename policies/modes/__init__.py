"""Pipeline modes: when training may start, how far generation may run ahead, how weights move.

Each mode is a registered :class:`ModeTraits`; :func:`build_controller` turns the traits
and a spec into the event-driven controller that both the simulator and the live
runtime execute.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.dispatch import DispatchPolicy
from policies.modes.base import Controller, ControllerConfig, PromptSource, ScalingRule
from policies.modes.conventional import ConventionalController
from policies.modes.pipeline import PipelineController
from policies.modes.wave import WaveController
from policies.protocols import LengthPredictor
from policies.records import InflightHandling, InstanceView
from policies.registry import Registry
from policies.spec import RunSpec


@dataclass(frozen=True, slots=True)
class ModeTraits:
    colocated: bool
    streaming: bool
    max_lag: int | None  # None: from ``pipeline.max_lag``
    continuous: bool  # True: PipelineRL-style continuous generation with in-flight updates
    conventional: bool = False  # G optimizer steps per generated batch of G·B samples

    def staleness_bound(self, spec: RunSpec) -> int:
        if self.conventional:
            return spec.pipeline.steps_per_generation - 1
        return spec.pipeline.max_lag if self.max_lag is None else self.max_lag


MODES: Registry[ModeTraits] = Registry("mode")

_TRAITS = {
    "colocated-sync": ModeTraits(colocated=True, streaming=False, max_lag=0, continuous=False),
    "disagg-sync": ModeTraits(colocated=False, streaming=False, max_lag=0, continuous=False),
    "stream-sync": ModeTraits(colocated=False, streaming=True, max_lag=0, continuous=False),
    "one-step-async": ModeTraits(colocated=False, streaming=False, max_lag=1, continuous=False),
    "stream-async": ModeTraits(colocated=False, streaming=True, max_lag=1, continuous=False),
    "pipeline": ModeTraits(colocated=False, streaming=True, max_lag=None, continuous=True),
    "conventional": ModeTraits(
        colocated=False, streaming=False, max_lag=0, continuous=False, conventional=True
    ),
}
for _name, _traits in _TRAITS.items():
    MODES.register(_name)(lambda t=_traits, **_: t)


def controller_config(spec: RunSpec, micro_batch_samples: int) -> ControllerConfig:
    traits = MODES.create(spec.pipeline.mode)
    return ControllerConfig(
        num_steps=spec.run.iterations,
        batch_size=spec.algorithm.batch_size,
        group_size=spec.algorithm.group_size,
        micro_batch_samples=micro_batch_samples,
        colocated=traits.colocated,
        streaming=traits.streaming,
        max_lag=traits.staleness_bound(spec),
        inflight=spec.pipeline.inflight if traits.continuous else InflightHandling.BARRIER,
        steps_per_wave=spec.pipeline.steps_per_generation if traits.conventional else 1,
    )


def build_controller(
    spec: RunSpec,
    prompts: PromptSource,
    predictor: LengthPredictor,
    dispatch: DispatchPolicy,
    instances: Sequence[InstanceView],
    micro_batch_samples: int,
    scaling: ScalingRule | None = None,
) -> Controller:
    config = controller_config(spec, micro_batch_samples)
    traits = MODES.create(spec.pipeline.mode)
    cls = (
        PipelineController
        if traits.continuous
        else ConventionalController
        if traits.conventional
        else WaveController
    )
    return cls(config, prompts, predictor, dispatch, instances, scaling)


__all__ = ["MODES", "ModeTraits", "Controller", "build_controller", "controller_config"]
