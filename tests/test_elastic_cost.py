"""GPU cost is charged for each instance's lifetime (``sim.gpu_cost``): an elastic instance
from its ``ScaleOut`` to its retirement, so retiring shows as a saving and a late addition
costs only from when it was asked for. Before: every instance that ever existed was
charged for the whole run, so elastic with ``retire`` reported the same
``cost_normalized_throughput`` as ``fixed`` (1.153 both, in the user's trial below).
``mean_generation_gpus`` says how many generation GPUs a run held on average."""

from __future__ import annotations

import pytest
from test_elastic_sim import _race

from experiments.specs import config_path
from policies.modes.events import InstanceAdded, InstanceRetired
from policies.results import SIM_METRICS
from policies.spec import load_spec
from sim import simulator
from sim.gpu_cost import GpuLease, mean_cost_units, mean_gpus
from sim.simulator import Simulation
from sim.tables import hardware

PRICES = {"H20": 0.125, "H800": 0.5}


def test_a_lease_costs_its_gpus_for_the_share_of_the_run_it_was_held():
    leases = [
        GpuLease("H800", 8),  # the whole run: its full cost
        GpuLease("H800", 2, start_s=25.0),  # added at 25 of 100 s: three quarters
        GpuLease("H20", 8, start_s=0.0, end_s=50.0),  # retired at half time
    ]
    assert mean_cost_units(leases, 100.0, PRICES) == 8 * 0.5 + 2 * 0.5 * 0.75 + 8 * 0.125 * 0.5
    assert mean_gpus(leases, 100.0) == 8 + 1.5 + 4
    assert mean_cost_units([GpuLease("B200", 8)], 100.0, PRICES) is None  # no price


def test_a_fixed_cluster_costs_exactly_what_it_did_before():
    """Held for the whole run, a lease's share is exactly 1.0: fixed runs keep every bit."""
    leases = [GpuLease("H800", 1) for _ in range(3)] + [GpuLease("H20", 8)]
    assert mean_cost_units(leases, 467.476975763879, PRICES) == sum([0.5, 0.5, 0.5, 1.0])


def _trial(allocation: str) -> dict:
    """The user's trial: elastic retires 24 → 8 instances of streamrl-7b, 8 trainer GPUs."""
    spec = load_spec(
        config_path("streamrl-7b"),
        [
            f"policies.allocation={allocation}",
            "cluster.generation.0.num_gpus=24",
            "cluster.trainer.num_gpus=8",
            "run.iterations=6",
            *(["policies.elastic.retire=true"] if allocation == "elastic" else []),
        ],
    )
    return Simulation(spec).run().metrics


def test_retiring_elastic_instances_shows_a_cost_saving():
    elastic, fixed = _trial("elastic"), _trial("fixed")
    assert elastic["throughput_samples_per_s"] == pytest.approx(fixed["throughput_samples_per_s"])
    assert elastic["cost_normalized_throughput"] > 1.5 * fixed["cost_normalized_throughput"]
    # the names say what they count: the starting size, every instance, the mean held
    assert elastic["generation_gpus"] == fixed["generation_gpus"] == 24
    assert elastic["num_generation_instances"] == 24
    assert 8 < elastic["mean_generation_gpus"] < 16
    assert fixed["mean_generation_gpus"] == 24
    price = hardware("H800").cost_per_gpu_rel_h20
    assert fixed["cost_normalized_throughput"] == pytest.approx(
        fixed["throughput_samples_per_s"] / (32 * price)
    )
    assert elastic["cost_normalized_throughput"] == pytest.approx(
        elastic["throughput_samples_per_s"] / ((elastic["mean_generation_gpus"] + 8) * price)
    )


def test_an_added_instance_is_charged_from_its_scale_out_and_a_retired_one_to_retirement(
    monkeypatch,
):
    """``sim.instance_start_s`` 0.5: an instance ready at t was asked for at t − 0.5, and
    its GPUs are paid for from then (its engine start and weight load)."""
    added, retired = {}, {}
    emit = simulator._World.emit

    def emit_recorded(self, event):  # noqa: ANN001, ANN202 - the world's own method
        if isinstance(event, InstanceAdded):
            added[event.view.instance_id] = event.time_s
        if isinstance(event, InstanceRetired):
            retired[event.instance_id] = event.time_s
        emit(self, event)

    monkeypatch.setattr(simulator._World, "emit", emit_recorded)
    for spec in (_race(), _race(policies__elastic__retire=True, run__iterations=6)):
        added.clear(), retired.clear()
        metrics = Simulation(spec).run().metrics
        end_s = metrics["makespan_s"]
        held_s = end_s + sum(
            retired.get(i, end_s) - (ready_s - spec.sim.instance_start_s)
            for i, ready_s in added.items()
        )
        held_s -= end_s - retired.get(0, end_s)  # instance 0, from the start
        assert added and metrics["mean_generation_gpus"] == pytest.approx(held_s / end_s)
        price = hardware("H800").cost_per_gpu_rel_h20
        cost = (metrics["mean_generation_gpus"] + spec.cluster.trainer.num_gpus) * price
        assert metrics["cost_normalized_throughput"] == pytest.approx(
            metrics["throughput_samples_per_s"] / cost
        )
    assert "mean_generation_gpus" in SIM_METRICS
