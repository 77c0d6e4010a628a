"""``balanced``'s split search (``policies.split_search``): its tie-break where the next batch
overlaps this one's drain, and its best-first pruning, which must not change the split."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.specs import config_path
from policies.allocation import BalancedAllocation
from policies.build import mode_of
from policies.rng import RngStreams
from policies.spec import load_spec
from policies.split_search import TIE_TOLERANCE, SplitPricing, best_split
from sim.cluster import stage_model
from sim.costs import build_cost_model
from sim.workload import Workload

TOTAL = 32


def _flat_tail(gen: int) -> float:
    """One batch alone: set by the long tail's instance from 12 GPUs on (flat at 200 s)."""
    return max(200.0, 2400.0 / gen)


def _pricing(floor: float = 0.0) -> SplitPricing:
    return SplitPricing(
        generation_s=_flat_tail,
        floor_s=lambda gen: floor * _flat_tail(gen),
        training_s=lambda train: 1200.0 / train,  # 10 trainer GPUs: 120 s
        capacity_s=lambda gen: 2400.0 / gen,  # the batch spread over every instance
    )


def test_a_flat_generation_estimate_gives_the_trainer_the_gpus_where_batches_do_not_overlap() -> (
    None
):
    # every split from 12 to 26 generation GPUs takes 200 s; the sum breaks the tie
    assert best_split(range(1, TOTAL), TOTAL, _pricing(), True, False) == (12, 20)


def test_where_batches_overlap_a_tie_goes_to_the_generation_capacity_training_keeps_up_with() -> (
    None
):
    # capacity 2400 / gen meets training 1200 / (32 - gen) at gen = 21.3: 21 GPUs leave
    # max(114.3, 109.1) = 114.3 s, 22 leave max(109.1, 120) = 120 s
    assert best_split(range(1, TOTAL), TOTAL, _pricing(), True, True) == (21, 11)


def test_splits_outside_the_tolerance_are_not_tied() -> None:
    pricing = SplitPricing(
        generation_s=lambda gen: 200.0 * (1 + 2 * TIE_TOLERANCE) if gen > 12 else _flat_tail(gen),
        floor_s=lambda gen: 0.0,
        training_s=lambda train: 1200.0 / train,
        capacity_s=lambda gen: 2400.0 / gen,
    )
    assert best_split(range(1, TOTAL), TOTAL, pricing, True, True) == (12, 20)


def _random_pricing(rng: np.random.Generator, with_floor: bool, priced: list[int]) -> SplitPricing:
    """Generation times in any order over the splits, floors below them, and a log of the
    splits whose generation is priced."""
    gen_s = {g: float(v) for g, v in zip(range(1, TOTAL), rng.uniform(50, 300, TOTAL - 1))}
    floors = {g: s * float(rng.uniform(0.3, 1.0)) for g, s in gen_s.items()}

    def generation_s(gen: int) -> float:
        priced.append(gen)
        return gen_s[gen]

    return SplitPricing(
        generation_s=generation_s,
        floor_s=lambda gen: floors[gen] if with_floor else 0.0,
        training_s=lambda train: 1500.0 / train,
        capacity_s=lambda gen: 0.8 * gen_s[gen],
    )


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("batches_overlap", [True, False])
def test_pruned_search_returns_what_pricing_every_split_returns(
    overlap: bool, batches_overlap: bool
) -> None:
    for seed in range(200):
        every_priced: list[int] = []
        every = _random_pricing(np.random.default_rng(seed), False, every_priced)
        pruned_priced: list[int] = []
        pruned = _random_pricing(np.random.default_rng(seed), True, pruned_priced)
        gens = range(1, TOTAL)
        assert best_split(gens, TOTAL, pruned, overlap, batches_overlap) == best_split(
            gens, TOTAL, every, overlap, batches_overlap
        )
        assert len(pruned_priced) <= len(every_priced) < TOTAL - 1  # some never priced


def _stage_model_split(mode: str) -> tuple[tuple[int, int], float, float]:
    spec = load_spec(config_path("streamrl-72b"), [
        "workload.max_output_tokens=20000", f"pipeline.mode={mode}",
        "policies.allocation=balanced", "policies.dispatch=skewness-aware",
        "policies.length_predictor=noisy-oracle", "policies.predictor_recall=0.87",
    ])  # fmt: skip
    cost = build_cost_model(spec)
    model = stage_model(spec, mode_of(spec), cost, Workload(spec, RngStreams(spec.run.seed)))
    pool = spec.cluster.generation[0]
    allocated = BalancedAllocation().allocate(spec.cluster, model)
    split = (allocated.generation[0].num_gpus, allocated.trainer.num_gpus)
    return split, model.generation_s(pool, 72), model.generation_s(pool, 80)


def test_72b_stream_async_keeps_the_generation_gpus_a_tied_estimate_cannot_rank() -> None:
    # the long tail's instances set one batch's time from 72 to 80 generation GPUs; the
    # trainer (48 GPUs at 80) keeps up with the capacity of 80, so stream-async takes 80
    # where stream-sync, whose next batch waits for this one, takes the trainer's 56
    (async_split, at_72_s, at_80_s) = _stage_model_split("stream-async")
    assert at_80_s == pytest.approx(at_72_s, rel=TIE_TOLERANCE)
    assert async_split == (80, 48)
    assert _stage_model_split("stream-sync")[0] == (72, 56)


@pytest.mark.parametrize(
    ("config", "max_output_tokens", "dispatch"),
    [("streamrl-7b", 20000, "skewness-aware"), ("streamrl-32b", 5000, "random")],
)
def test_the_generation_floor_lies_below_the_dispatched_estimate(
    config: str, max_output_tokens: int, dispatch: str
) -> None:
    spec = load_spec(config_path(config), [
        f"workload.max_output_tokens={max_output_tokens}", "pipeline.mode=stream-async",
        f"policies.dispatch={dispatch}", "policies.scheduling=fcfs",
    ])  # fmt: skip
    cost = build_cost_model(spec)
    model = stage_model(spec, mode_of(spec), cost, Workload(spec, RngStreams(spec.run.seed)))
    pool = spec.cluster.generation[0]
    for gen in range(pool.tp, 64, pool.tp):
        assert 0 < model.generation_floor_s(pool, gen) <= model.generation_s(pool, gen)
