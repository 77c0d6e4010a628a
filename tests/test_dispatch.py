"""Dispatch policies: exact assignments on hand-built examples; the registry's rules."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import FreeCost, request, view

from policies.dispatch import (
    DISPATCH,
    LeastLoadedDispatch,
    RandomDispatch,
    RoundRobinDispatch,
    SkewnessAwareDispatch,
    group_latency_s,
    instance_latency_s,
)
from policies.protocols import Device
from policies.registry import Registry


class BatchCost(FreeCost):
    """A cost model whose decode step costs ``1 + batch`` seconds, whatever the context."""

    def __init__(self) -> None:
        self.calls: list[tuple[Device, int, int]] = []

    def decode_step_s(self, device: Device, batch_size: int, context_tokens: int) -> float:
        self.calls.append((device, batch_size, context_tokens))
        return 1.0 + batch_size


def _requests(preds: list[float | None]) -> list:
    return [request(i, p, prompt_tokens=0) for i, p in enumerate(preds)]


# -- registry ---------------------------------------------------------------------------


def test_dispatch_registry_names():
    required = {"least-loaded", "random", "round-robin", "skewness-aware"}
    assert required <= set(DISPATCH.names())
    assert DISPATCH.names() == sorted(DISPATCH.names())


def test_registry_rejects_duplicates_and_unknown_names():
    reg: Registry[object] = Registry("thing")
    reg.register("a")(lambda **_: "made a")
    assert "a" in reg and "b" not in reg
    assert reg.create("a") == "made a"
    with pytest.raises(ValueError, match="'a' is already registered"):
        reg.register("a")(lambda **_: "another a")
    assert reg.create("a") == "made a"  # the first one stays
    with pytest.raises(ValueError, match="unknown thing policy 'b'; choose one of a"):
        reg.create("b")


def test_real_dispatch_registry_rejects_a_duplicate():
    with pytest.raises(ValueError, match="already registered"):
        DISPATCH.register("round-robin")(RoundRobinDispatch)
    with pytest.raises(ValueError, match="unknown dispatch policy 'fastest'"):
        DISPATCH.create("fastest")


def test_every_policy_needs_an_instance():
    for policy in (RandomDispatch(), RoundRobinDispatch(), LeastLoadedDispatch()):
        with pytest.raises(ValueError, match="at least one"):
            policy.assign(_requests([1.0]), [])


# -- random, round-robin, least-loaded ---------------------------------------------------------


def test_random_is_the_seeded_stream_over_instance_ids():
    views = [view(10), view(20), view(30)]
    reqs = _requests([None] * 12)
    got = RandomDispatch(rng=np.random.default_rng(7)).assign(reqs, views)
    picks = np.random.default_rng(7).integers(0, 3, size=12)
    assert got == [[10, 20, 30][int(i)] for i in picks]
    again = RandomDispatch(rng=np.random.default_rng(7)).assign(reqs, views)
    assert again == got
    other = RandomDispatch(rng=np.random.default_rng(8)).assign(reqs, views)
    assert other != got


def test_round_robin_cycles_and_keeps_its_cursor_across_calls():
    views = [view(10), view(20), view(30)]
    rr = RoundRobinDispatch()
    assert rr.assign(_requests([None] * 4), views) == [10, 20, 30, 10]
    assert rr.assign(_requests([None] * 3), views) == [20, 30, 10]
    assert rr.assign([], views) == []


def test_least_loaded_by_predicted_tokens():
    views = [view(0, assigned_tokens=100.0), view(1), view(2, assigned_tokens=50.0)]
    # loads 0:100 1:0 2:50 → r0(30)→1 (30), r1(40)→1 (70), r2(60)→2 (110), r3(10)→1 (80)
    assert LeastLoadedDispatch().assign(_requests([30, 40, 60, 10]), views) == [1, 1, 2, 1]


def test_least_loaded_without_predictions_balances_request_counts():
    views = [view(0, num_assigned=2), view(1), view(2, num_assigned=1)]
    # counts 2,0,1 → 1; 2,1,1 → 1 (tie, lower id); 2,2,1 → 2; 2,2,2 → 0
    assert LeastLoadedDispatch().assign(_requests([None] * 4), views) == [1, 1, 2, 0]


class RateCost(BatchCost):
    """H800 decodes a step twice as fast as H20, at every batch and context."""

    def decode_step_s(self, device: Device, batch_size: int, context_tokens: int) -> float:
        self.calls.append((device, batch_size, context_tokens))
        return 1.0 if device.hardware == "H800" else 2.0


def test_least_loaded_balances_time_across_hardware():
    """Before: tokens, so the H20 (1) got as many as the twice-as-fast H800 (0)."""
    views = [view(0, max_num_seqs=4), view(1, max_num_seqs=4, hardware="H20")]
    cost = RateCost()
    # as the builder makes it: offered the executor's cost model
    built = DISPATCH.create_from("least-loaded", {"cost_model": cost, "rng": None})
    targets = built.assign(_requests([10] * 9), views)
    # expected time: H800 10·(1/4) s a request, H20 10·(2/4): 0 gets 2 for each 1 of 1
    assert targets == [0, 1, 0, 0, 1, 0, 0, 1, 0]
    assert targets.count(0) == 2 * targets.count(1)
    # without predictions it balances expected time by request count the same way
    assert LeastLoadedDispatch(cost).assign(_requests([None] * 6), views) == [0, 1, 0, 0, 1, 0]
    # a token priced at each instance's full batch: a bigger batch makes the H20 as fast
    fast_h20 = [views[0], view(1, max_num_seqs=8, hardware="H20")]
    assert LeastLoadedDispatch(cost).assign(_requests([10] * 4), fast_h20) == [0, 1, 0, 1]


def test_least_loaded_on_one_kind_of_instance_never_asks_the_cost_model():
    cost = RateCost()
    views = [view(0, assigned_tokens=100.0), view(1), view(2, assigned_tokens=50.0)]
    assert LeastLoadedDispatch(cost).assign(_requests([30, 40, 60, 10]), views) == [1, 1, 2, 1]
    assert cost.calls == []


def test_least_loaded_does_not_mutate_the_views():
    views = [view(0), view(1)]
    LeastLoadedDispatch().assign(_requests([5, 5, 5]), views)
    assert [(v.num_assigned, v.assigned_tokens) for v in views] == [(0, 0.0), (0, 0.0)]


# -- skewness-aware (StreamRL Alg. 2) ------------------------------------------------------------

# Ten requests; 0.8-quantile = 104 + 0.2·36 = 111.2, so 140 and 150 are the long tail.
# p50 = 99, p90 = 140 + 0.1·10 = 141. With PTL(BS) = 1 + BS and every request fitting
# in one batch, an instance's latency is (1 + M)·L:
#   n_long=1: long 3·141 = 423, regular (1+ceil(8/3))·99 = 396 → sum 819, max 423
#   n_long=2: long 2·141 = 282, regular 5·99 = 495            → sum 777, max 495
#   n_long=3: long 282,         regular 9·99 = 891            → sum 1173, max 891
PREDS = [90, 92, 94, 96, 98, 100, 102, 104, 140, 150]


def test_instance_latency_model():
    cost = BatchCost()
    v = view(0, max_num_seqs=4)
    assert instance_latency_s(cost, v, 0, 100.0, 10.0) == 0.0
    assert instance_latency_s(cost, v, 3, 100.0, 10.0) == pytest.approx(4 * 100)
    # 10 requests, batches of 4: ceil(10/4) = 3 rounds of PTL(4)·L
    assert instance_latency_s(cost, v, 10, 100.0, 10.0) == pytest.approx(5 * 100 * 3)
    # the context passed to the cost model is batch × (prompt + L/2)
    assert cost.calls[-1] == (Device("H800", 1), 4, int(4 * (10.0 + 50.0)))


def test_skewness_aware_sum_objective_split_and_placement():
    d = SkewnessAwareDispatch(cost_model=BatchCost(), objective="sum")
    got = d.assign(_requests(PREDS), [view(i, max_num_seqs=100) for i in range(4)])
    assert d.last_num_long == 2
    # long tail (150, 140) on instances {0, 1}; the rest, longest first, to the lighter of
    # {2, 3}: 104→2, 102→3, 100→3, 98→2, 96→2 (tie 202/202, equal counts, lower id),
    # 94→3, 92→3, 90→2
    assert got == [2, 3, 3, 2, 2, 3, 3, 2, 1, 0]


def test_skewness_aware_max_objective_split_and_placement():
    d = SkewnessAwareDispatch(cost_model=BatchCost(), objective="max")
    got = d.assign(_requests(PREDS), [view(i, max_num_seqs=100) for i in range(4)])
    assert d.last_num_long == 1
    # long tail both on instance 0; regular: 104→1, 102→2, 100→3, 98→3, 96→2, 94→1,
    # 92→1 (all at 198, equal counts, lowest id), 90→2
    assert got == [2, 1, 1, 2, 3, 3, 2, 1, 0, 0]


def test_skewness_aware_marks_the_top_fifth_of_a_whole_batch():
    # 25 requests: a whole batch, so exactly the top 5 by prediction are long-tail
    preds = [float(10 + i) for i in range(20)] + [1000.0, 900.0, 800.0, 700.0, 600.0]
    d = SkewnessAwareDispatch(cost_model=BatchCost(), objective="sum")
    got = d.assign(_requests(preds), [view(i, max_num_seqs=100) for i in range(5)])
    num_long = d.last_num_long
    assert num_long is not None and 1 <= num_long <= 4
    long_ids = set(range(num_long))
    assert all(got[i] in long_ids for i in range(20, 25))
    assert all(got[i] not in long_ids for i in range(20))


def test_skewness_aware_single_instance_and_argument_checks():
    d = SkewnessAwareDispatch(cost_model=BatchCost())
    assert d.assign(_requests(PREDS), [view(7)]) == [7] * len(PREDS)
    with pytest.raises(ValueError, match="cost model"):
        SkewnessAwareDispatch()
    with pytest.raises(ValueError, match="dispatch_objective"):
        SkewnessAwareDispatch(cost_model=BatchCost(), objective="mean")


def test_skewness_aware_long_instances_run_smaller_batches():
    rng = np.random.default_rng(3)
    preds = [float(x) for x in np.round(rng.lognormal(6, 1, size=200))]
    d = SkewnessAwareDispatch(cost_model=BatchCost(), objective="sum")
    got = d.assign(_requests(preds), [view(i) for i in range(8)])
    num_long = d.last_num_long
    assert num_long is not None and 1 <= num_long < 8
    count = {i: got.count(i) for i in range(8)}
    long_max = max(count[i] for i in range(num_long))
    regular_min = min(count[i] for i in range(num_long, 8))
    assert long_max < regular_min


def test_skewness_aware_group_by_group_marks_only_the_long_prompts():
    # a continuous mode dispatches one group (four samples of a prompt) at a time: the
    # long-tail threshold must come from what has been seen so far, not from the first
    # group alone (a first short group made every later prompt at least as long "long")
    d = SkewnessAwareDispatch(cost_model=BatchCost(), objective="sum", long_tail_fraction=0.08)
    instances = [view(0, max_num_seqs=64), view(1, max_num_seqs=64)]
    lengths = [3, 4, 100, 5, 3, 4, 5, 3, 120, 4, 5, 3]
    placed: list[set[int]] = []
    for g, length in enumerate(lengths):
        group = [request(4 * g + j, float(length), prompt_tokens=0) for j in range(4)]
        targets = d.assign(group, instances)
        for t in targets:  # outstanding work, as the controller counts it
            instances[t].num_assigned += 1
            instances[t].assigned_tokens += length
        placed.append(set(targets))
    assert d.last_num_long == 1
    # the long prompts went to the long-tail instance (0); once one had been seen, every
    # short one went to the other
    assert placed[2] == {0} and placed[8] == {0}
    assert all(placed[g] == {1} for g in range(3, len(lengths)) if g != 8)


class TwoHardwareCost(BatchCost):
    """H20 decodes one sequence faster than H800 (2 s against 2.5 s) and a big batch slower."""

    def decode_step_s(self, device: Device, batch_size: int, context_tokens: int) -> float:
        self.calls.append((device, batch_size, context_tokens))
        if device.hardware == "H20":
            return 1.0 + batch_size
        return 2.0 + 0.5 * batch_size


def _two_pools(first: str, second: str) -> list:
    kinds = [first, first, second, second]
    return [view(i, max_num_seqs=100, hardware=k) for i, k in enumerate(kinds)]


def test_skewness_aware_puts_the_long_tail_on_the_fastest_single_sequence_hardware():
    # the pools' order in the spec used to decide: the long tail went to the lowest ids
    d = SkewnessAwareDispatch(cost_model=TwoHardwareCost(), objective="sum")
    h800_first = d.assign(_requests(PREDS), _two_pools("H800", "H20"))
    assert d.last_num_long is not None and 1 <= d.last_num_long <= 2
    assert {h800_first[8], h800_first[9]} <= {2, 3}  # 140 and 150 on the H20s
    d = SkewnessAwareDispatch(cost_model=TwoHardwareCost(), objective="sum")
    h20_first = d.assign(_requests(PREDS), _two_pools("H20", "H800"))
    # the same placement, the pools' ids swapped
    assert h20_first == [(i + 2) % 4 for i in h800_first]


def test_skewness_aware_prices_a_group_by_its_slowest_instance():
    cost = TwoHardwareCost()
    h20, h800 = view(0, max_num_seqs=100, hardware="H20"), view(1, max_num_seqs=100)
    # one request each: a token costs the H20 2 s, the H800 2.5 s at batch 1
    assert group_latency_s(cost, [h20], 1, 10.0, 0.0) == pytest.approx(2.0 * 10)
    assert group_latency_s(cost, [h20, h800], 2, 10.0, 0.0) == pytest.approx(2.5 * 10)
    # three requests over two instances: two each (ceil), priced at the slower's batch 2
    assert group_latency_s(cost, [h20, h800], 3, 10.0, 0.0) == pytest.approx(3.0 * 10)
