"""Generation utilisation and the bubbles count each instance over the time it held its
GPUs (``sim.gpu_cost``'s leases: from the start or its ``ScaleOut`` to its retirement or
the run's end). Before: every instance counted from when it was ready to the run's end, so
a retired one's idle time after retiring stayed in the denominators and elastic with
``retire`` understated utilisation (0.2676 in the trial below, which held 12.02 of its 24
GPUs on average)."""

from __future__ import annotations

import pytest

from experiments.specs import config_path
from policies.intervals import length, merged
from policies.records import SpanKind
from policies.resources import is_generation
from policies.results import GEN_BUSY
from policies.spec import load_spec
from sim.simulator import Simulation


def test_elastic_utilization_is_busy_time_over_held_time():
    """The trial of ``test_elastic_cost``: elastic retires 24 → 8 one-GPU instances."""
    spec = load_spec(
        config_path("streamrl-7b"),
        [
            "policies.allocation=elastic",
            "policies.elastic.retire=true",
            "cluster.generation.0.num_gpus=24",
            "cluster.trainer.num_gpus=8",
            "run.iterations=6",
        ],
    )
    assert spec.cluster.generation[0].tp == 1  # a GPU held is an instance held
    result = Simulation(spec).run()
    m, end_s = result.metrics, result.metrics["makespan_s"]
    gen_busy = [(s.start_s, s.end_s, s.resource) for s in result.spans if s.kind in GEN_BUSY]
    gen_busy_s = sum(
        length(merged((a, b) for a, b, r in gen_busy if r == name))
        for name in {r for _, _, r in gen_busy if is_generation(r)}
    )
    train = [(s.start_s, s.end_s) for s in result.spans if s.kind == SpanKind.TRAIN]
    train_busy_s = length(merged(t for t in train))
    held_s = m["mean_generation_gpus"] * end_s  # instance-seconds held, as costed
    assert held_s < 0.75 * m["num_generation_instances"] * end_s  # retiring gave GPUs back
    assert m["generation_utilization"] == pytest.approx(gen_busy_s / held_s)
    idle_s = held_s - gen_busy_s + max(0.0, end_s - train_busy_s)
    assert m["skewness_bubble_s"] + m["pipeline_bubble_s"] == pytest.approx(idle_s)
