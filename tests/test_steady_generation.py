"""The stage model's steady-state generation for continuous modes (``pipeline``): a step
costs the larger of capacity and the longest request over ``lag + 1`` steps, at the
sequences running that make it shortest; ``balanced`` splits by it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from test_allocation import UnitCost, _cluster

from policies.allocation import BalancedAllocation
from policies.cluster import GenerationPool
from policies.protocols import Device
from policies.spec import load_spec
from policies.stage_model import StageModel
from sim.simulator import Simulation

CONFIGS = Path(__file__).resolve().parents[1] / "experiments/configs"
ITERATIONS = 3
LENGTHS = list(range(1, 41))  # mean 20.5 tokens
LONGEST = float(np.quantile(LENGTHS, 1 - 0.5 / 64))  # a batch of 64's longest, 39.695


class AffineCost(UnitCost):
    """A decode step of ``r`` sequences takes ``1 + r / 8`` seconds."""

    def decode_step_s(self, device: Device, batch_size: int, context_tokens: int) -> float:
        return 1.0 + batch_size / 8


def _model(lag: int | None, cost: UnitCost | None = None) -> StageModel:
    return StageModel(cost or UnitCost(), 64, 0.0, LENGTHS, continuous_lag=lag)


def _pool(max_num_seqs: int = 8) -> GenerationPool:
    return GenerationPool(num_gpus=16, max_num_seqs=max_num_seqs)


def test_batch_modes_wait_for_the_drain():
    assert _model(None).step_generation_s(_pool(), 16) == _model(None).generation_s(_pool(), 16)


def test_a_continuous_step_costs_capacity_or_the_tail_spread_over_lag_plus_one():
    # 1 s a decode step whatever runs: all slots run; 16 instances, 4 requests each
    # lag 0: 4 in flight; the longest takes 39.695 steps (capacity 4 · 20.5 / 4 = 20.5 s)
    assert _model(0).step_generation_s(_pool(), 16) == pytest.approx(LONGEST)
    # lag 3: 16 in flight fill the 8 slots: capacity 4 · 20.5 / 8 = 10.25 s > 39.695 / 4
    assert _model(3).step_generation_s(_pool(), 16) == 10.25
    # 2 instances: 32 requests each on 8 slots, 32 · 20.5 / 8 = 82 s
    assert _model(15).step_generation_s(_pool(), 2) == 82.0


@pytest.mark.parametrize("lag", [0, 1, 4, 16])
@pytest.mark.parametrize("instances", [1, 3, 16, 64])
def test_the_sequences_running_are_what_the_engine_holds_or_what_makes_the_step_shortest(
    instances: int, lag: int
):
    # more sequences: more tokens a step, each step slower. Where the lag budget lets more
    # be in flight than the 64 slots hold, all 64 run; else the least max (brute force)
    model, pool = _model(lag, AffineCost()), _pool(max_num_seqs=64)
    in_flight = math.ceil((lag + 1) * 64 / instances)
    per_instance = math.ceil(64 / instances)

    def step_s(r: int) -> float:
        capacity_s = per_instance * 20.5 * (1 + r / 8) / r
        return max(capacity_s, LONGEST * (1 + r / 8) / (lag + 1))

    expected_s = step_s(64) if in_flight > 64 else min(map(step_s, range(1, in_flight + 1)))
    assert model.step_generation_s(pool, instances) == pytest.approx(expected_s)


class TwoSeqs:
    """A KV cache that holds two running sequences of the mean context."""

    def kv_tokens(self, pool: GenerationPool) -> int:
        return int(2 * float(np.mean(np.square(LENGTHS))) / (2 * 20.5)) + 1


def test_a_kv_cache_that_holds_fewer_runs_fewer():
    # 16 instances at lag 3 let 16 be in flight; a cache of 2 sequences' context runs 2
    cache = StageModel(AffineCost(), 64, 0.0, LENGTHS, continuous_lag=3, kv_cache=TwoSeqs())
    capacity_s, tail_s = 4 * 20.5 * 1.25 / 2, LONGEST * 1.25 / 4
    assert cache.step_generation_s(_pool(), 16) == pytest.approx(max(capacity_s, tail_s))


def test_balanced_gives_a_continuous_trainer_what_the_drain_no_longer_takes():
    cluster = _cluster(16, 16)  # training 64 · 20.5 / GPUs s
    drained = BalancedAllocation().allocate(cluster, _model(None))
    steady = BalancedAllocation().allocate(cluster, _model(15))
    assert steady.trainer.num_gpus > drained.trainer.num_gpus


def _throughput(allocation: str, iterations: int) -> tuple[float, int]:
    """samples/s and trainer GPUs of ``streamrl-7b`` (16 + 16 H800) in ``pipeline`` at lag 1."""
    spec = load_spec(
        CONFIGS / "streamrl-7b.yaml",
        [
            f"run.iterations={iterations}",
            "pipeline.mode=pipeline",
            "pipeline.max_lag=1",
            f"policies.allocation={allocation}",
        ],
    )
    metrics = Simulation(spec).run().metrics
    return metrics["throughput_samples_per_s"], metrics["trainer_gpus"]


def test_balanced_pipeline_beats_the_even_split_it_was_given():
    # the drain-priced model moved GPUs to generation (18 / 14 GPUs, 0.88x the even split)
    even_per_s, _ = _throughput("fixed", ITERATIONS)
    balanced_per_s, trainer_gpus = _throughput("balanced", ITERATIONS)
    assert trainer_gpus > 16
    assert balanced_per_s > even_per_s
