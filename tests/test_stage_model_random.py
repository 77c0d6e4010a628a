"""``random`` dispatch in the stage model (``StageModel.generation_s`` with ``BatchShares``):
it may stack requests on one instance while others idle, so a pool with more instances
than the batch has requests is priced by dispatching over every instance, not as a pool
of as many instances as requests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from helpers import FreeCost

from experiments.specs import config_path
from policies.build import mode_of
from policies.cluster import GenerationPool
from policies.dispatch import STACKING_DISPATCH, DispatchPolicy, RandomDispatch
from policies.dispatch_shares import BatchShares, quantile_batch
from policies.protocols import Device
from policies.records import InstanceView
from policies.rng import RngStreams
from policies.spec import load_spec
from policies.stage_model import EXACT_INSTANCES, StageModel
from sim.cluster import stage_model
from sim.costs import build_cost_model
from sim.workload import Workload

BATCH = 8  # requests of 100 tokens each, no prompt
SEED = 7


class PerSequenceCost(FreeCost):
    """A step costs 0.01 s a sequence: an instance decodes ``k`` of the batch's 100-token
    requests in ``k`` seconds (up to its slots)."""

    def decode_step_s(self, device: Device, batch_size: int, context_tokens: int) -> float:
        return 0.01 * batch_size


def _random() -> DispatchPolicy:
    return RandomDispatch(np.random.default_rng(SEED))


def _model(new_dispatch: Callable[[], DispatchPolicy], spreads: bool) -> StageModel:
    batch = lambda: quantile_batch([100] * 10, BATCH, 0.0)  # noqa: E731
    shares = BatchShares(new_dispatch, lambda device: 10**9, batch, spreads=spreads)
    return StageModel(PerSequenceCost(), BATCH, 0.0, [100] * 10, shares=shares)


def _most_stacked(instances: int) -> int:
    """The most requests ``random`` puts on one of ``instances`` instances."""
    views = [InstanceView(i, "H800", 1, "dc0", BATCH, 10**9) for i in range(instances)]
    ids = _random().assign(quantile_batch([100] * 10, BATCH, 0.0).requests, views)
    return int(np.bincount(ids).max())


@pytest.mark.parametrize("instances", [BATCH, 4 * BATCH, EXACT_INSTANCES])
def test_random_is_priced_by_its_dispatch_over_every_instance(instances: int) -> None:
    # over 8 instances this draw stacks 2 requests on one (2 s); over 32, none (1 s):
    # pricing the 32 as 8 (as the stage model did) took 2 s
    pool = GenerationPool(num_gpus=instances, max_num_seqs=BATCH)
    model = _model(_random, spreads=False)
    assert model.generation_s(pool) == pytest.approx(_most_stacked(instances))


def test_random_stacks_less_over_more_instances_than_requests() -> None:
    assert [_most_stacked(n) for n in (BATCH, 4 * BATCH)] == [2, 1]


def test_a_spreading_dispatch_is_priced_at_the_batchs_count() -> None:
    # a dispatch that gives each of 8 instances one request: 1 s however many instances
    model = _model(_random, spreads=True)
    pool = GenerationPool(num_gpus=4 * BATCH, max_num_seqs=BATCH)
    assert model.generation_s(pool) == model.generation_s(pool, BATCH)


def test_a_16384_instance_pool_under_random_dispatches_a_few_dozen_times() -> None:
    model = _model(_random, spreads=False)
    pool = GenerationPool(num_gpus=16384, max_num_seqs=BATCH)
    times = [model.generation_s(pool, n) for n in range(EXACT_INSTANCES + 1, 16385, 97)]
    assert all(1.0 <= t_s <= 3.0 for t_s in times)
    assert len(model._dispatched) <= 60  # counts 10 % apart from 128 to 16384: 52


@pytest.mark.parametrize(("dispatch", "spreads"), [("random", False), ("skewness-aware", True)])
def test_the_runs_stage_model_dispatches_random_over_every_instance(
    dispatch: str, spreads: bool
) -> None:
    spec = load_spec(config_path("streamrl-7b"), [
        f"policies.dispatch={dispatch}", "pipeline.mode=stream-sync",
    ])  # fmt: skip
    workload = Workload(spec, RngStreams(spec.run.seed))
    model = stage_model(spec, mode_of(spec), build_cost_model(spec), workload)
    assert model.shares is not None
    assert model.shares.spreads is spreads
    assert (dispatch in STACKING_DISPATCH) is not spreads
