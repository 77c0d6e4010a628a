"""The simulated trainer's data parallelism: a job keeps at most one GPU per micro-batch
busy (``policies.data_parallel``), and the optimizer step is reported on its own."""

from __future__ import annotations

import pytest
from helpers import small_spec

from policies.data_parallel import busy_trainer_gpus
from policies.records import SpanKind
from policies.resources import TRAINER
from sim.simulator import Simulation


def test_busy_trainer_gpus_is_one_per_micro_batch_at_most():
    assert [busy_trainer_gpus(g, 4, 1) for g in (1, 2, 4, 16, 64)] == [1, 2, 4, 4, 4]
    assert [busy_trainer_gpus(16, n, 4) for n in (0, 1, 4, 5, 64, 65)] == [1, 1, 1, 2, 16, 16]


def _forward_backward_s(num_gpus: int, micro_batch_per_gpu: int = 1) -> float:
    spec = small_spec(
        cluster__trainer__num_gpus=num_gpus,
        algorithm__batch_size=4,
        algorithm__micro_batch_per_gpu=micro_batch_per_gpu,
        pipeline__mode="disagg-sync",
    )
    result = Simulation(spec).run()
    jobs = [s for s in result.spans if s.resource == TRAINER and s.kind == SpanKind.TRAIN]
    return sum(s.end_s - s.start_s for s in jobs if s.batch_size)  # optimizer steps: None


def test_train_time_stops_falling_past_the_batch():
    t1, t4, t16, t64 = (_forward_backward_s(g) for g in (1, 4, 16, 64))
    assert t1 == pytest.approx(4 * t4)  # 4 samples: up to 4 GPUs share the work
    assert t16 == pytest.approx(t4) and t64 == pytest.approx(t4)  # the rest have none
    assert _forward_backward_s(16, micro_batch_per_gpu=2) == pytest.approx(2 * t4)


def test_simulated_steps_report_their_optimizer_step():
    """The optimizer job is the gradient all-reduce's exposed part and the optimizer step,
    each reported (a 2-GPU trainer: ``sim.comm``)."""
    result = Simulation(small_spec(run__iterations=3)).run()
    optimizer_spans = [
        s.end_s - s.start_s
        for s in result.spans
        if s.resource == TRAINER and s.kind == SpanKind.TRAIN and s.batch_size is None
    ]
    reported = [s["optimizer_s"] + s["grad_sync_s"] for s in result.steps]
    assert reported == pytest.approx(optimizer_spans)
    assert all(s["optimizer_s"] > 0 for s in result.steps)
