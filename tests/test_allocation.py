"""Resource allocation: fixed, balanced (StreamRL Alg. 1, single and cross-datacenter), elastic."""

from __future__ import annotations

import logging

import pytest
from helpers import make_spec, small_spec

from policies.allocation import (
    ALLOCATION,
    BalancedAllocation,
    ElasticAllocation,
    FixedAllocation,
    StageModel,
)
from policies.build import build_allocation
from policies.cluster import ClusterSection
from policies.protocols import Device
from sim.simulator import Simulation


class UnitCost:
    """Decode step = 1 s whatever the batch; training = tokens / GPUs seconds."""

    def decode_step_s(self, device: Device, batch_size: int, context_tokens: int) -> float:
        return 1.0

    def prefill_s(self, device: Device, num_tokens: int) -> float:
        return 0.0

    def train_s(self, device: Device, num_tokens: int, num_micro_batches: int = 1) -> float:
        return num_tokens / device.num_gpus

    def weight_transfer_s(self, num_bytes: float, gbps: float, latency_s: float) -> float:
        return 0.0


def _model() -> StageModel:
    # 64 samples of exactly 10 tokens and no prompt: a wave takes 10 s whatever its batch,
    # training takes 640 / GPUs seconds.
    return StageModel(cost=UnitCost(), batch_size=64, prompt_tokens=0.0, output_tokens=[10] * 100)


def _cluster(gen: int, train: int, gen_dc: str = "dc0", max_num_seqs: int = 8) -> ClusterSection:
    return ClusterSection.model_validate(
        {
            "generation": [{"num_gpus": gen, "datacenter": gen_dc, "max_num_seqs": max_num_seqs}],
            "trainer": {"num_gpus": train, "datacenter": "dc0"},
        }
    )


def test_allocation_registry():
    assert {"balanced", "elastic", "fixed"} <= set(ALLOCATION.names())
    with pytest.raises(ValueError, match="already registered"):
        ALLOCATION.register("fixed")(FixedAllocation)


def test_stage_model_times():
    m = _model()
    pool = _cluster(8, 8).generation[0]
    # per instance ceil(64/g) requests on max_num_seqs = 8 slots, continuously batched: the
    # ones beyond the first 8 take 10 steps each on one of 8 busy slots, then 10 s of drain
    # (g = 3: 22 requests, 14 · 10 / 8 + 10 = 27.5 s; g = 5: 13, 5 · 10 / 8 + 10 = 16.25 s)
    assert [m.generation_s(pool, g) for g in (1, 2, 3, 4, 5, 8, 16)] == [
        80.0,
        40.0,
        27.5,
        20.0,
        16.25,
        10.0,
        10.0,
    ]
    assert m.training_s("H800", 16) == pytest.approx(40.0)


def test_drain_prices_a_shrinking_batch():
    # lengths 1..4 in a batch of 4: the batch shrinks 4, 3, 2, 1 over four 1-s steps;
    # with a cost of `running` seconds per step, draining takes 4 + 3 + 2 + 1 = 10 s
    class PerSeq(UnitCost):
        def decode_step_s(self, device, batch_size, context_tokens):
            return float(batch_size)

    m = StageModel(cost=PerSeq(), batch_size=4, prompt_tokens=0.0, output_tokens=[1, 2, 3, 4])
    pool = _cluster(1, 1, max_num_seqs=4).generation[0]
    assert m.generation_s(pool) == pytest.approx(10.0)


def test_generation_time_falls_with_instances_at_equal_wave_counts():
    # 16 then 13 requests an instance on 8 slots: two waves of 8 either way, but with
    # continuous batching the 13 finish sooner (the old count of full waves said equal)
    m = StageModel(UnitCost(), batch_size=64, prompt_tokens=0.0, output_tokens=list(range(1, 41)))
    pool = _cluster(4, 4).generation[0]
    times = [m.generation_s(pool, g) for g in (4, 5, 6, 7, 8)]
    assert times == sorted(times, reverse=True) and len(set(times)) == 5


def test_the_slowest_instance_holds_the_batchs_longest_request():
    # lengths 1..1000 and a 1-s step whatever the batch: draining takes as many steps as the
    # longest request of the instance. Of 10 instances, one holds the batch's longest, at
    # the quantile (1000 - 1/2) / 1000 (999.5, rounded to 1000), as one instance holding all
    # does; the quantile of one instance's 100, (100 - 1/2) / 100, said 995.
    lengths = list(range(1, 1001))
    m = StageModel(UnitCost(), batch_size=1000, prompt_tokens=0.0, output_tokens=lengths)
    pool = _cluster(10, 1, max_num_seqs=1000).generation[0]
    assert [m.generation_s(pool, g) for g in (1, 10)] == [1000.0, 1000.0]


def test_generation_adds_the_prefill_of_the_instance_prompts():
    calls = []

    class Prefill:
        def prefill_s(self, device, num_prompts, prompt_tokens, max_batched_tokens):
            calls.append((device, num_prompts, prompt_tokens, max_batched_tokens))
            return 7.0

    m = StageModel(UnitCost(), 64, 100.0, [10] * 100, prefill=Prefill())
    pool = _cluster(8, 8).generation[0]
    # 4 instances of 16 requests on 8 slots: 8 · 10 / 8 + 10 = 20 s of decode, then prefill
    assert m.generation_s(pool, 4) == 27.0
    assert calls == [(Device("H800", 1), 16, 100.0, pool.max_num_batched_tokens)]


def test_fixed_keeps_the_cluster():
    cluster = _cluster(3, 5)
    assert FixedAllocation().allocate(cluster, _model()) is cluster


def test_balanced_single_datacenter_minimises_the_slower_stage():
    # 16 GPUs: g=1 → max(80, 42.7); g=2 → max(40, 45.7); g=3 → max(30, 49.2); g≥4 → ≥ 53.3
    out = BalancedAllocation().allocate(_cluster(8, 8), _model())
    assert (out.generation[0].num_gpus, out.trainer.num_gpus) == (2, 14)


def test_balanced_minimises_the_sum_where_the_stages_take_turns():
    # disagg-sync: an iteration takes T_gen + T_train. 16 GPUs: g=2 → 40 + 45.7 = 85.7;
    # g=3 → 27.5 + 49.2 = 76.7; g=4 → 20 + 53.3 = 73.3; g=5 → 16.25 + 58.2 = 74.4; the
    # slower stage alone picks 2/14 (the test above)
    m = _model()
    m.stages_overlap = False
    out = BalancedAllocation().allocate(_cluster(8, 8), m)
    assert (out.generation[0].num_gpus, out.trainer.num_gpus) == (4, 12)
    # across datacenters nothing is shrunk to match (it would lengthen the iteration); the
    # trainer still drops the GPUs one batch cannot keep busy (64 samples: 64 GPUs)
    for gen, train, kept in [(8, 4, 4), (2, 32, 32), (2, 80, 64)]:
        out = BalancedAllocation().allocate(_cluster(gen, train, gen_dc="dc1"), m)
        assert (out.generation[0].num_gpus, out.trainer.num_gpus) == (gen, kept)


def test_only_modes_whose_stages_take_turns_minimise_the_sum():
    from policies.modes import MODES

    for steps_per_generation in (1, 4):  # conventional's G: bound G - 1, still in turns
        turns = {
            name
            for name in MODES.names()
            if not MODES.get(name).stages_overlap(
                MODES.get(name).staleness_bound(None, steps_per_generation)
            )
        }
        assert turns == {"colocated-sync", "disagg-sync", "conventional"}


def test_balanced_split_is_optimal_over_every_split():
    m = _model()
    cluster = _cluster(10, 6)
    out = BalancedAllocation().allocate(cluster, m)
    pool = cluster.generation[0]
    gen, train = out.generation[0].num_gpus, out.trainer.num_gpus
    assert gen + train == 16
    best = max(m.generation_s(pool, gen), m.training_s("H800", train))
    for g in range(1, 16):
        assert best <= max(m.generation_s(pool, g), m.training_s("H800", 16 - g))


def test_balanced_cross_datacenter_shrinks_the_faster_stage():
    # generation in dc1 cannot take trainer GPUs. 2 gen GPUs: 40 s; 32 trainer GPUs: 20 s
    # → trainer shrinks while 640 / t ≤ 40, i.e. to 16 GPUs
    out = BalancedAllocation().allocate(_cluster(2, 32, gen_dc="dc1"), _model())
    assert (out.generation[0].num_gpus, out.trainer.num_gpus) == (2, 16)
    # 8 gen GPUs: 10 s; 4 trainer GPUs: 160 s → generation shrinks to one GPU (80 s ≤ 160)
    out = BalancedAllocation().allocate(_cluster(8, 4, gen_dc="dc1"), _model())
    assert (out.generation[0].num_gpus, out.trainer.num_gpus) == (1, 4)


def test_training_s_stops_falling_past_one_gpu_per_micro_batch():
    # 64 samples of 10 tokens: 640 token-seconds over the busy GPUs, at most one GPU per
    # micro-batch (64 of one sample, 16 of four samples)
    m = _model()
    assert [m.training_s("H800", g) for g in (16, 64, 128)] == pytest.approx([40.0, 10.0, 10.0])
    m4 = StageModel(UnitCost(), 64, 0.0, [10] * 100, micro_batch_per_gpu=4)
    assert [m4.training_s("H800", g) for g in (8, 16, 64)] == pytest.approx([80.0, 40.0, 40.0])


class _GrowingStepCost:
    """An optimizer step that costs 5 s per trainer GPU (as an all-reduce over more GPUs)."""

    def step_s(self, device: Device, num_samples: int, num_tokens: float) -> float:
        return 5.0 * device.num_gpus


def test_balanced_splits_by_the_step_the_trainer_pays_not_its_passes_alone():
    # 16 GPUs, training 640 / t + 5 t s: g=2 → max(40, 45.7 + 70); g=4 → max(20, 53.3 + 60);
    # g=5 → max(16.25, 58.2 + 55 = 113.2); g=6 → max(13.75, 64 + 50); without the step the
    # split was 2/14 (test_balanced_single_datacenter_minimises_the_slower_stage)
    m = StageModel(UnitCost(), 64, 0.0, [10] * 100, step_cost=_GrowingStepCost())
    assert m.training_s("H800", 11) == pytest.approx(640 / 11 + 55)
    assert m.forward_backward_s("H800", 11) == pytest.approx(640 / 11)
    out = BalancedAllocation().allocate(_cluster(8, 8), m)
    assert (out.generation[0].num_gpus, out.trainer.num_gpus) == (5, 11)


@pytest.mark.parametrize("trainer_gpus", [2, 16])
def test_stage_model_trains_a_batch_in_the_time_the_simulated_trainer_takes(trainer_gpus):
    """The stage model Alg. 1 splits with, given one simulated step's batch, prices its
    training as the simulated trainer paid it: forward and backward on the busy GPUs, the
    exposed gradient all-reduce over every trainer GPU (NVLink at 2, the NIC at 16) and the
    optimizer step (before, it left out the last two)."""
    from sim.costs import build_cost_model
    from sim.step_cost import StepCost

    spec = small_spec(
        run__iterations=1,
        pipeline__mode="disagg-sync",
        cluster__trainer__num_gpus=trainer_gpus,
        algorithm__batch_size=32,
        algorithm__group_size=2,
    )
    result = Simulation(spec).run()
    samples = [r for r in result.samples if r.train_step == 0]
    cost = build_cost_model(spec)
    stages = StageModel(
        cost,
        batch_size=len(samples),
        prompt_tokens=sum(r.prompt_tokens for r in samples) / len(samples),
        output_tokens=[r.output_tokens for r in samples],
        micro_batch_per_gpu=spec.algorithm.micro_batch_per_gpu,
        step_cost=StepCost.of(spec, cost),
    )
    (step,) = result.steps
    assert step["grad_sync_s"] > 0 and step["optimizer_s"] > 0
    assert stages.training_s("H800", trainer_gpus) == pytest.approx(step["busy_s"], rel=1e-9)


def test_balanced_gives_the_trainer_no_gpu_a_tiny_batch_cannot_use():
    # a batch of 2: training is 20 / min(GPUs, 2) s, generation 10 s on any number of GPUs;
    # every split from 2 trainer GPUs up ties at 10 s, so the trainer keeps just 2
    tiny = StageModel(cost=UnitCost(), batch_size=2, prompt_tokens=0.0, output_tokens=[10] * 100)
    out = BalancedAllocation().allocate(_cluster(8, 8), tiny)
    assert (out.generation[0].num_gpus, out.trainer.num_gpus) == (14, 2)
    # across datacenters, a trainer slower than generation still drops GPUs it cannot use
    slow = StageModel(UnitCost(), 2, 100.0, [10] * 100)  # 220 / min(GPUs, 2) s of training
    out = BalancedAllocation().allocate(_cluster(2, 32, gen_dc="dc1"), slow)
    assert out.trainer.num_gpus == 2


@pytest.mark.parametrize("policy", [BalancedAllocation(), ElasticAllocation()])
def test_balanced_and_elastic_need_one_pool_and_say_which_policy(policy):
    cluster = ClusterSection.model_validate({"generation": [{"num_gpus": 2}, {"num_gpus": 2}]})
    name = "balanced" if isinstance(policy, BalancedAllocation) else "elastic"
    with pytest.raises(ValueError, match=rf"policies\.allocation '{name}' .*one generation pool"):
        policy.allocate(cluster, _model())


class _InverseModel:
    """Generation time inversely proportional to GPUs: k more of n instances save k/(n+k)."""

    def step_generation_s(self, pool: object, num_gpus: int) -> float:
        return 100.0 / num_gpus


class _FlatModel:
    """More instances save nothing (the long tail sets the time)."""

    def step_generation_s(self, pool: object, num_gpus: int) -> float:
        return 100.0


def test_elastic_adds_an_instance_when_delta_exceeds_delta_prime():
    e = ElasticAllocation(max_extra_instances=2, instances_per_step=1)
    assert e.allocate(_cluster(4, 4), _InverseModel()) == _cluster(4, 4)  # type: ignore[arg-type]
    # Δ = 100 − 50 = 50 > Δ′ = 100·1/5 = 20 → add one
    assert e.instances_to_add(100.0, 50.0, 4) == 1
    # Δ = 10 ≤ Δ′ = 100/6 → none
    assert e.instances_to_add(100.0, 90.0, 5) == 0
    assert e.instances_to_add(100.0, 10.0, 5) == 1
    assert e.instances_to_add(100.0, 0.0, 6) == 0  # the cap of 2 extra is reached
    assert e.added == 2


def test_elastic_scales_out_where_more_instances_help_despite_equal_wave_counts(caplog):
    # H2 in small: 4 → 5 instances take 16 → 13 requests each on 8 slots (2 waves either
    # way); more instances still shorten generation, so elastic must add one
    e = ElasticAllocation(max_extra_instances=4, instances_per_step=1)
    m = StageModel(UnitCost(), batch_size=64, prompt_tokens=0.0, output_tokens=list(range(1, 41)))
    e.allocate(_cluster(4, 4), m)
    with caplog.at_level(logging.INFO, logger="policies.allocation"):
        assert e.instances_to_add(100.0, 50.0, 4, time_s=812.25) == 1
    assert "elastic at 812.2 s: 4 → 5 generation instances" in caplog.text
    assert "predicted saving" in caplog.text


def test_elastic_logs_a_declined_scale_out_once_per_reason(caplog):
    e = ElasticAllocation(max_extra_instances=1, instances_per_step=1)
    e.allocate(_cluster(4, 4), _InverseModel())  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="policies.allocation"):
        for t in (1.0, 2.0, 3.0):
            assert e.instances_to_add(100.0, 100.0, 4, time_s=t) == 0  # keeps up
        assert e.instances_to_add(100.0, 95.0, 4, time_s=4.0) == 0  # would overshoot
        assert e.instances_to_add(100.0, 10.0, 4, time_s=5.0) == 1
        for t in (6.0, 7.0):
            assert e.instances_to_add(100.0, 10.0, 5, time_s=t) == 0  # at the cap
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4
    assert lines[0].startswith("elastic at 1.0 s: keeps 4 generation instances")
    assert "no longer than training" in lines[0]
    assert "overshoot" in lines[1] and "4 → 5" in lines[2] and "max_extra_instances" in lines[3]


def test_elastic_adds_nothing_when_more_instances_would_not_help():
    e = ElasticAllocation(max_extra_instances=4, instances_per_step=1)
    e.allocate(_cluster(4, 4), _FlatModel())  # type: ignore[arg-type]
    assert e.instances_to_add(100.0, 10.0, 4) == 0
    assert e.added == 0


def test_elastic_retires_an_instance_only_when_fewer_would_still_keep_up():
    e = ElasticAllocation(max_extra_instances=2, instances_per_step=1, retire=True)
    e.allocate(_cluster(4, 4), _InverseModel())  # type: ignore[arg-type]
    # 4 → 3 instances: generation 60 s · 4/3 = 80 s ≤ 90 s of training → retire one
    assert e.instances_to_retire(60.0, 90.0, 4) == 1
    assert e.instances_to_retire(60.0, 79.0, 4) == 0  # 80 s > 79 s: it would lag
    assert e.instances_to_retire(10.0, 90.0, 1) == 0  # never the last one
    off = ElasticAllocation(max_extra_instances=2, instances_per_step=1)
    off.allocate(_cluster(4, 4), _InverseModel())  # type: ignore[arg-type]
    assert off.instances_to_retire(60.0, 90.0, 4) == 0  # retire is off by default


def test_elastic_add_and_retire_do_not_undo_each_other():
    e = ElasticAllocation(max_extra_instances=8, instances_per_step=1, retire=True)
    e.allocate(_cluster(4, 4), _InverseModel())  # type: ignore[arg-type]
    for gen_s, train_s, n in [(100.0, 50.0, 4), (100.0, 90.0, 5), (40.0, 100.0, 4)]:
        added = e.instances_to_add(gen_s, train_s, n)
        retired = e.instances_to_retire(gen_s, train_s, n)
        assert not (added and retired)
        if added:  # generation on n + added instances would still not beat training
            assert gen_s * n / (n + added) > train_s
        if retired:
            assert gen_s * n / (n - retired) <= train_s


def test_elastic_step_size_from_the_spec():
    spec = make_spec(
        {
            "policies.allocation": "elastic",
            "policies.elastic.gpus_per_step": 8,
            "policies.elastic.max_extra_instances": 3,
            "cluster.generation.0.tp": 2,
        }
    )
    e = build_allocation(spec)
    assert isinstance(e, ElasticAllocation)
    assert (e.instances_per_step, e.max_extra_instances) == (4, 3)
    # four at a time would exceed the cap of three: only three are added
    assert e.instances_to_add(1000.0, 0.0, 4) == 3
