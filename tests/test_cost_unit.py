"""``cost_normalized_throughput`` is samples/s per H20-machine cost unit (hardware.csv prices
an 8-GPU machine): its labels say so, and its value is per machine, not per GPU."""

from __future__ import annotations

import pytest
from helpers import small_spec

from policies.results import METRICS
from sim.simulator import Simulation
from sim.tables import hardware


def test_the_metric_names_its_unit_as_the_cost_of_one_8_gpu_h20_machine():
    """Before: 'samples/s per H20-GPU unit of cost', 8 times off what it computes."""
    meaning = next(m.meaning for m in METRICS if m.name == "cost_normalized_throughput")
    assert "H20-machine cost unit" in meaning and "8-GPU H20 machine" in meaning
    assert "H20-GPU" not in meaning and meaning.startswith("samples/s per H20-machine")


def test_an_h20_gpu_costs_an_eighth_of_a_unit():
    assert hardware("H20").cost_per_gpu_rel_h20 == pytest.approx(1 / 8)


def test_the_value_is_throughput_per_h20_machine_equivalent():
    spec = small_spec(**{"cluster.generation.0.hardware": "H20",
                         "cluster.trainer.hardware": "H20"})  # fmt: skip
    metrics = Simulation(spec).run().metrics
    gpus = spec.cluster.generation[0].num_gpus + spec.cluster.trainer.num_gpus
    assert metrics["cost_normalized_throughput"] == pytest.approx(
        metrics["throughput_samples_per_s"] / (gpus / 8)
    )
