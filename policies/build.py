"""One builder: a spec, plus what only the executor knows, becomes the policies of a run.

The simulator (``sim.simulator``) and the live launcher (``runtime.launcher``) both call
:func:`build_policies`. Each passes only what it alone knows, as
:class:`ExecutorInputs` — its cost model, the true-length function, its prompt source,
its random streams, the trainer's micro-batch, a fitted or online ranker — and the
instances it has (:func:`instance_views`). Everything the spec decides is decided here,
once: the mode (:data:`policies.modes.MODES`), its controller, dispatch, scheduling,
length predictor and allocation.

Factories get their arguments by name (:meth:`policies.registry.Registry.create_from`):
every ``policies.*`` key of the spec is offered under its own name, plus the executor's
inputs and the few constructor names of spec keys below (``_ALIASES``); a factory asking
for anything else is an error naming it. So a new dispatch policy with a new knob is a
class in ``policies/dispatch.py`` and a key in ``PoliciesSection`` — nothing here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from numpy.random import Generator

from policies.allocation import ALLOCATION, AllocationPolicy
from policies.cluster import GenerationPool
from policies.dispatch import DISPATCH, DispatchPolicy
from policies.modes import MODES, Controller, ControllerConfig, ModeTraits
from policies.modes.base import PromptSource, ScalingRule
from policies.predictors import PREDICTORS, TruthFn
from policies.protocols import CostModel, Device, LengthPredictor
from policies.records import InflightHandling, InstanceView
from policies.rng import RngStreams
from policies.scheduling import SCHEDULING, SchedulingPolicy
from policies.spec import PoliciesSection, RunSpec

KvCapacity = Callable[[Device], int]  # KV-cache tokens an instance of this device holds


@dataclass(slots=True)
class ExecutorInputs:
    """What only the executor knows: the simulator and the live runtime each fill one."""

    cost_model: CostModel  # prices dispatch splits (sim: its own; live: calibrated or tiny)
    prompts: PromptSource
    rngs: RngStreams  # named streams: "dispatch", "predictor"
    micro_batch_samples: int  # samples per trainer micro-batch
    truth: TruthFn | None = None  # true output length (oracle predictors); None: unknown
    calibration_lengths: Sequence[int] | None = None  # noisy-oracle's length sample
    ranker: LengthPredictor | None = None  # ``length_predictor: ranker``, built by the caller
    can_scale_out: bool = False  # the executor can add instances (``allocation: elastic``)


@dataclass(slots=True)
class RunPolicies:
    """Every policy object of one run."""

    mode: ModeTraits
    allocation: AllocationPolicy
    scheduling: SchedulingPolicy
    predictor: LengthPredictor
    dispatch: DispatchPolicy
    controller: Controller


def mode_of(spec: RunSpec) -> ModeTraits:
    return MODES.get(spec.pipeline.mode)


def build_policies(
    spec: RunSpec,
    inputs: ExecutorInputs,
    instances: Sequence[InstanceView],
    allocation: AllocationPolicy | None = None,
) -> RunPolicies:
    """The policies of a run of ``spec`` on ``instances``; ``allocation``: one already built
    (the simulator sizes its cluster with it before it has instances)."""
    allocation = allocation if allocation is not None else build_allocation(spec)
    knobs = _knobs(spec)
    predictor = build_predictor(
        spec, inputs.truth, inputs.rngs.get("predictor"), inputs.calibration_lengths,
        inputs.ranker,
    )  # fmt: skip
    dispatch = build_dispatch(spec, inputs.cost_model, inputs.rngs.get("dispatch"))
    scaling = allocation if inputs.can_scale_out and isinstance(allocation, ScalingRule) else None
    controller = build_controller(
        spec, inputs.prompts, predictor, dispatch, instances, inputs.micro_batch_samples, scaling
    )
    scheduling = SCHEDULING.create_from(spec.policies.scheduling, knobs)
    return RunPolicies(mode_of(spec), allocation, scheduling, predictor, dispatch, controller)


def build_allocation(spec: RunSpec) -> AllocationPolicy:
    return ALLOCATION.create_from(spec.policies.allocation, _knobs(spec))


def build_predictor(
    spec: RunSpec,
    truth: TruthFn | None,
    rng: Generator,
    calibration_lengths: Sequence[int] | None = None,
    ranker: LengthPredictor | None = None,
) -> LengthPredictor:
    """The length predictor of ``spec`` (the run's, and the stage model's to predict the
    batch it splits: ``policies.dispatch_shares``)."""
    inputs = {"truth": truth, "rng": rng, "calibration_lengths": calibration_lengths}
    knobs = {**_knobs(spec), **inputs, "ranker": ranker}
    return PREDICTORS.create_from(spec.policies.length_predictor, knobs)


def build_dispatch(spec: RunSpec, cost_model: CostModel, rng: Generator) -> DispatchPolicy:
    """A fresh dispatch policy of ``spec`` (the run's, and the stage model's to split a
    batch with: ``policies.dispatch_shares``)."""
    knobs = {**_knobs(spec), "rng": rng, "cost_model": cost_model}
    return DISPATCH.create_from(spec.policies.dispatch, knobs)


# constructor names of spec keys (the spec's name is offered too)
_ALIASES: dict[str, Callable[[RunSpec], object]] = {
    "objective": lambda s: s.policies.dispatch_objective,
    "target_recall": lambda s: s.policies.predictor_recall,
    "max_extra_instances": lambda s: s.policies.elastic.max_extra_instances,
    "retire": lambda s: s.policies.elastic.retire,
    "instances_per_step": lambda s: max(
        1, s.policies.elastic.gpus_per_step // s.cluster.generation[0].tp
    ),
}


def _knobs(spec: RunSpec) -> dict[str, object]:
    """Every ``policies.*`` key of the spec by name, and the aliases of some."""
    own = {name: getattr(spec.policies, name) for name in PoliciesSection.model_fields}
    return {**own, **{name: value(spec) for name, value in _ALIASES.items()}}


# -- the controller -----------------------------------------------------------------------


def controller_config(spec: RunSpec, micro_batch_samples: int) -> ControllerConfig:
    mode = mode_of(spec)
    p = spec.pipeline
    overlap = bool(p.overlap_waves) and not mode.continuous  # pipeline overlaps by design
    return ControllerConfig(
        num_steps=spec.run.iterations,
        batch_size=spec.algorithm.batch_size,
        group_size=spec.algorithm.group_size,
        micro_batch_samples=micro_batch_samples,
        colocated=mode.colocated,
        streaming=mode.streaming,
        max_lag=_staleness_bound(mode, p.max_lag, p.steps_per_generation),
        inflight=p.inflight if mode.continuous or overlap else InflightHandling.BARRIER,
        steps_per_wave=p.steps_per_generation if mode.conventional else 1,
        push_every=p.push_every if mode.continuous else 1,
        overlap_waves=overlap,
    )


def _staleness_bound(mode: ModeTraits, max_lag: int | None, steps_per_generation: int) -> int:
    try:
        return mode.staleness_bound(max_lag, steps_per_generation)
    except ValueError as err:  # a spec changed without validation (model_copy)
        raise ValueError(f"pipeline.max_lag: {err}") from None


def build_controller(
    spec: RunSpec,
    prompts: PromptSource,
    predictor: LengthPredictor,
    dispatch: DispatchPolicy,
    instances: Sequence[InstanceView],
    micro_batch_samples: int,
    scaling: ScalingRule | None = None,
) -> Controller:
    """The spec's mode's controller over ``instances`` (for tests: policies given)."""
    config = controller_config(spec, micro_batch_samples)
    cls = mode_of(spec).controller
    return cls(config, prompts, predictor, dispatch, instances, scaling)


# -- instances --------------------------------------------------------------------------------


def instance_view(
    instance_id: int, pool: GenerationPool, kv_capacity_tokens: KvCapacity, version: int = 0
) -> InstanceView:
    """What policies see of one instance of ``pool`` (holding weights ``version``)."""
    return InstanceView(
        instance_id=instance_id,
        hardware=pool.hardware,
        tp=pool.tp,
        datacenter=pool.datacenter,
        max_num_seqs=pool.max_num_seqs,
        kv_capacity_tokens=kv_capacity_tokens(Device(pool.hardware, pool.tp)),
        version=version,
    )


def instance_views(
    spec: RunSpec, kv_capacity_tokens: KvCapacity, num_instances: int | None = None
) -> list[InstanceView]:
    """One view per instance, ids from 0: every instance of every pool of the spec's
    cluster, or (live: one server per instance) ``num_instances`` of its first pool."""
    pools = spec.cluster.generation
    if num_instances is None:
        flat = [pool for pool in pools for _ in range(pool.num_instances)]
    else:
        flat = [pools[0]] * num_instances
    return [instance_view(i, pool, kv_capacity_tokens) for i, pool in enumerate(flat)]
