"""The one builder: registries that take exactly what factories name, and both executors
(simulator and live launcher) building their policies through it."""

from __future__ import annotations

import pytest
from helpers import FakePrompts, small_spec

import sim.simulator
from policies.allocation import ALLOCATION, ElasticAllocation
from policies.build import ExecutorInputs, build_policies, instance_views
from policies.dispatch import DISPATCH, SkewnessAwareDispatch
from policies.modes import MODES, ConventionalController, PipelineController, WaveController
from policies.predictors import PREDICTORS
from policies.registry import Registry, named_parameters
from policies.rng import RngStreams
from policies.scheduling import SCHEDULING, LptScheduling
from runtime.cost import TinyCostModel


def _inputs(**kw) -> ExecutorInputs:
    return ExecutorInputs(
        cost_model=TinyCostModel(), prompts=FakePrompts(8, 2), rngs=RngStreams(0),
        micro_batch_samples=4, **kw,
    )  # fmt: skip


def test_a_factory_rejects_an_argument_it_does_not_name():
    with pytest.raises(ValueError, match="objectve"):
        DISPATCH.create("skewness-aware", cost_model=TinyCostModel(), objectve="max")
    with pytest.raises(ValueError, match="rng"):
        SCHEDULING.create("lpt", rng=None)


def test_a_factory_asking_for_an_input_nobody_offers_is_an_error_naming_it():
    reg: Registry = Registry("thing")
    reg.register("a")(lambda cost_model, long_tail_fracton=0.2: (cost_model, long_tail_fracton))
    assert reg.create_from("a", {"cost_model": 1, "long_tail_fracton": 2}) == (1, 2)
    with pytest.raises(ValueError, match="'long_tail_fracton', which nothing offers"):
        reg.create_from("a", {"cost_model": 1, "long_tail_fraction": 0.2})


@pytest.mark.parametrize("family", [DISPATCH, SCHEDULING, PREDICTORS, ALLOCATION])
def test_every_registered_factory_names_its_arguments(family):
    for name in family.names():
        named_parameters(family.get(name))  # raises on a **kwargs catch-all


def test_each_mode_is_one_registry_entry_with_its_controller_class():
    controllers = {name: traits.controller for name, traits in MODES.items()}
    assert controllers["pipeline"] is PipelineController
    assert controllers["conventional"] is ConventionalController
    assert controllers["stream-async"] is controllers["colocated-sync"] is WaveController
    assert all(traits.name == name for name, traits in MODES.items())


@pytest.mark.parametrize("dispatch", DISPATCH.names())
@pytest.mark.parametrize("allocation", ALLOCATION.names())
def test_the_builder_offers_every_factory_what_it_names(dispatch, allocation):
    spec = small_spec(policies__dispatch=dispatch, policies__allocation=allocation)
    views = instance_views(spec, lambda device: 1000)
    built = build_policies(spec, _inputs(truth=lambda r: 5, can_scale_out=True), views)
    assert isinstance(built.dispatch, DISPATCH.get(dispatch))
    assert isinstance(built.allocation, ALLOCATION.get(allocation))
    assert isinstance(built.scheduling, LptScheduling)
    scaling = built.controller._scaling
    assert (scaling is built.allocation) == isinstance(built.allocation, ElasticAllocation)


def test_skewness_aware_dispatch_gets_the_spec_knobs_and_the_executors_cost_model():
    spec = small_spec(policies__dispatch_objective="max", policies__long_tail_fraction=0.3)
    cost = TinyCostModel()
    inputs = _inputs(truth=lambda r: 5)
    inputs.cost_model = cost
    built = build_policies(spec, inputs, instance_views(spec, lambda device: 1000))
    d = built.dispatch
    assert isinstance(d, SkewnessAwareDispatch)
    assert (d._cost, d._objective, d._fraction) == (cost, "max", 0.3)


def test_instance_views_come_from_the_spec_pools():
    spec = small_spec(cluster__generation=[
        {"hardware": "H800", "num_gpus": 2, "tp": 1, "datacenter": "dc0", "max_num_seqs": 8},
        {"hardware": "H20", "num_gpus": 4, "tp": 2, "datacenter": "dc1", "max_num_seqs": 16},
    ])  # fmt: skip
    views = instance_views(spec, lambda device: 100 * device.num_gpus)
    assert [(v.instance_id, v.hardware, v.tp, v.datacenter, v.max_num_seqs) for v in views] == [
        (0, "H800", 1, "dc0", 8), (1, "H800", 1, "dc0", 8),
        (2, "H20", 2, "dc1", 16), (3, "H20", 2, "dc1", 16),
    ]  # fmt: skip
    assert [v.kv_capacity_tokens for v in views] == [100, 100, 200, 200]
    live = instance_views(spec, lambda device: 7, num_instances=3)
    assert [(v.instance_id, v.hardware, v.tp) for v in live] == [(i, "H800", 1) for i in range(3)]


def test_the_simulator_builds_its_policies_through_the_builder(monkeypatch):
    calls = []

    def spy(spec, inputs, instances, allocation=None):
        calls.append((inputs, list(instances)))
        return build_policies(spec, inputs, instances, allocation)

    monkeypatch.setattr(sim.simulator, "build_policies", spy)
    result = sim.simulator.Simulation(small_spec()).run()
    assert result.metrics["num_samples_trained"] == 16
    ((inputs, views),) = calls
    assert inputs.can_scale_out and inputs.truth is not None
    assert [v.instance_id for v in views] == [0, 1]


def test_the_live_launcher_builds_its_policies_through_the_builder():
    from runtime.live_run import live_kv_capacity_tokens, live_policies
    from runtime.tasks import TaskPromptSource, TaskSet

    spec = small_spec(
        policies__dispatch="skewness-aware", policies__allocation="elastic",
        cluster__generation__0__hardware="H20", cluster__generation__0__tp=2,
        cluster__generation__0__max_num_seqs=16,
    )  # fmt: skip
    tasks = TaskSet(0, 64, 64)
    built = live_policies(spec, tasks, TaskPromptSource(tasks, 8, 2), num_instances=3)
    views = list(built.controller.views.values())
    assert [(v.instance_id, v.hardware, v.tp, v.max_num_seqs) for v in views] == [
        (i, "H20", 2, 16) for i in range(3)
    ]  # the spec's pool, not a hard-coded one
    assert views[0].kv_capacity_tokens == live_kv_capacity_tokens(spec) == 16 * 512
    assert built.controller._scaling is built.allocation  # elastic: the actor adds servers live
    assert isinstance(built.dispatch, SkewnessAwareDispatch)
