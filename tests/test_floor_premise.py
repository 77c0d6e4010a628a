"""The generation floor's premise (``policies.floor_premise``): where a cost model's decode
step breaks it, the floor is no lower bound, so ``balanced`` prices every split and returns
what pricing every split returns."""

from __future__ import annotations

import logging
from functools import partial

import pytest

from policies.allocation import BalancedAllocation
from policies.calibrated import CalibratedCosts, OperatorFit
from policies.cluster import ClusterSection
from policies.dispatch import RoundRobinDispatch
from policies.dispatch_shares import BatchShares, quantile_batch
from policies.floor_premise import floor_premise_holds
from policies.protocols import Device
from policies.split_search import SplitPricing, best_split
from policies.stage_model import StageModel

TOTAL = 74  # GPUs to split; one batch keeps at most 64 trainer GPUs busy
LENGTHS = list(range(1, 200))  # output lengths, mean 100


class RisingPerTokenCost:
    """A step of ``b`` sequences costs ``0.01 b²`` s (a calibrated fit whose only decode
    basis is ``n^2``): a token costs more in a bigger batch. Training: ``tokens / 2`` GPU-s."""

    def decode_step_s(self, device: Device, batch_size: int, context_tokens: int) -> float:
        return 0.01 * batch_size**2

    def prefill_s(self, device: Device, num_tokens: int) -> float:
        return 0.0

    def train_s(self, device: Device, num_tokens: int, num_micro_batches: int = 1) -> float:
        return 0.5 * num_tokens / device.num_gpus

    def weight_transfer_s(self, num_bytes: float, gbps: float, latency_s: float) -> float:
        return 0.0


class FallingWithContextCost(RisingPerTokenCost):
    """A token costs 0.1 s while its sequence holds fewer than 60 tokens of KV, 0.01 s
    after: cheaper as the context grows (0.01 s a token whatever the batch)."""

    def decode_step_s(self, device: Device, batch_size: int, context_tokens: int) -> float:
        per_token_s = 0.1 if context_tokens < 60 * batch_size else 0.01
        return per_token_s * batch_size


def _cluster() -> ClusterSection:
    return ClusterSection.model_validate(
        {
            "generation": [{"num_gpus": 8, "max_num_seqs": 16}],
            "trainer": {"num_gpus": TOTAL - 8},
        }
    )


def _model(cost: RisingPerTokenCost) -> StageModel:
    shares = BatchShares(
        RoundRobinDispatch, lambda device: 10**9, lambda: quantile_batch(LENGTHS, 64, 0.0)
    )
    return StageModel(cost, 64, 0.0, LENGTHS, shares=shares)


def _every_split_priced(cost: RisingPerTokenCost) -> tuple[int, int] | None:
    model, pool = _model(cost), _cluster().generation[0]
    pricing = SplitPricing(
        generation_s=partial(model.step_generation_s, pool),
        floor_s=lambda gen: 0.0,
        training_s=partial(model.training_s, pool.hardware),
        capacity_s=partial(model.even_generation_s, pool),
    )
    return best_split(range(1, TOTAL), TOTAL, pricing, True, False)


@pytest.mark.parametrize(
    ("cost", "every_split"),
    [(RisingPerTokenCost(), (10, 64)), (FallingWithContextCost(), (9, 65))],
)
def test_a_cost_model_that_breaks_the_premise_gets_the_split_pricing_every_split_gets(
    cost: RisingPerTokenCost, every_split: tuple[int, int]
) -> None:
    # the floor as it stood (a full batch's per-token cost at the mean context) lies above
    # these estimates, e.g. 102.4 s against 34.1 s at 10 GPUs of the rising cost, so the
    # search skipped the best split: it returned (18, 56) and (13, 61)
    model = _model(cost)
    allocated = BalancedAllocation().allocate(_cluster(), model)
    assert _every_split_priced(cost) == every_split
    assert (allocated.generation[0].num_gpus, allocated.trainer.num_gpus) == every_split
    pool = _cluster().generation[0]
    assert all(model.generation_floor_s(pool, g) <= model.generation_s(pool, g) for g in (1, 10))


def test_a_broken_premise_is_logged_once_per_pool_shape(caplog: pytest.LogCaptureFixture) -> None:
    model = _model(RisingPerTokenCost())
    with caplog.at_level(logging.INFO, logger="policies.stage_model"):
        BalancedAllocation().allocate(_cluster(), model)
    broken = [r for r in caplog.records if "breaks the generation floor's premise" in r.message]
    assert len(broken) == 1
    assert "prices every split" in broken[0].message


class ConcaveInContextCost(RisingPerTokenCost):
    """A token costs ``0.01 √context`` s whatever the batch: it grows with the context, but
    slower and slower (a request's mean context then overprices its steps)."""

    def decode_step_s(self, device: Device, batch_size: int, context_tokens: int) -> float:
        return 0.01 * batch_size * (context_tokens / batch_size) ** 0.5


class SharedKvCost(RisingPerTokenCost):
    """A step costs 1 µs a KV token over the batch's sequences: one sequence holding all
    of a batch's KV costs more than the batch (the longest request alone is no bound)."""

    def decode_step_s(self, device: Device, batch_size: int, context_tokens: int) -> float:
        return 1e-6 * context_tokens / batch_size


@pytest.mark.parametrize(
    "cost",
    [RisingPerTokenCost(), FallingWithContextCost(), ConcaveInContextCost(), SharedKvCost()],
)
def test_the_premise_check_finds_each_broken_condition(cost: RisingPerTokenCost) -> None:
    assert not floor_premise_holds(cost, Device("H800", 1), 16, 10, 210)


class AffineCost(RisingPerTokenCost):
    """The roofline's shape: a fixed step cost plus a cost per sequence and per KV token."""

    def decode_step_s(self, device: Device, batch_size: int, context_tokens: int) -> float:
        return 0.02 + 0.001 * batch_size + 1e-6 * context_tokens


def test_an_affine_cost_meets_the_premise_and_keeps_its_floor() -> None:
    assert floor_premise_holds(AffineCost(), Device("H800", 1), 16, 0, 200)
    model, pool = _model(AffineCost()), _cluster().generation[0]
    assert 0 < model.generation_floor_s(pool, 8) <= model.generation_s(pool, 8)


def _calibrated(bases: tuple[str, ...], coefs: tuple[float, ...]) -> CalibratedCosts:
    decode = OperatorFit(bases, coefs, heldout_mape=0.1)
    return CalibratedCosts({"decode": decode}, weight_bytes=1.0, kv_capacity=10**6, source={})


@pytest.mark.parametrize(
    ("bases", "coefs", "max_num_seqs", "holds"),
    [  # the decode fits of docs/reports/fidelity-run9 and fidelity-run10
        (("1", "n", "ctx"), (8.08e-3, 6.94e-5, 1.28e-6), 256, True),
        (("1", "n", "n^2"), (8.93e-3, 0.0, 2.51e-6), 16, True),
        (("1", "n", "n^2"), (8.93e-3, 0.0, 2.51e-6), 256, False),
    ],
)
def test_a_calibrated_fit_with_a_square_term_breaks_the_premise_at_big_batches(
    bases: tuple[str, ...], coefs: tuple[float, ...], max_num_seqs: int, holds: bool
) -> None:
    # with an n² term a token costs 8.93 ms / n + 2.51 µs · n: least at n = 60, so at 256
    # slots a full batch's token (0.68 ms) costs more than a batch of 60's (0.30 ms)
    cost = _calibrated(bases, coefs)
    assert floor_premise_holds(cost, Device("H100", 1), max_num_seqs, 100, 2100) is holds
