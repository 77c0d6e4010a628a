"""The cluster a simulated run uses: colocated modes share every GPU, and the allocation
policy may re-split the spec's cluster between generation and training."""

from __future__ import annotations

import logging
import math

import numpy as np

from policies.allocation import AllocationPolicy, BalancedAllocation
from policies.build import build_allocation, build_dispatch, build_predictor, mode_of
from policies.calibrated import CalibratedCosts
from policies.cluster import ClusterSection, GenerationPool, TrainerPool
from policies.dispatch import STACKING_DISPATCH
from policies.dispatch_shares import Batch, BatchShares, quantile_batch
from policies.logs import held_warnings
from policies.modes import ModeTraits
from policies.predictors import OraclePredictor
from policies.protocols import Device
from policies.results import split_metrics
from policies.rng import RngStreams
from policies.spec import RunSpec
from policies.stage_model import StageModel
from sim.calibrated import CalibratedCostModel
from sim.comm import GPUS_PER_MACHINE
from sim.costs import ModelDoesNotFit, RooflineCostModel, SimCostModel, build_cost_model
from sim.kv_cache import blocks_for
from sim.models import TpDoesNotShard
from sim.prefill_cost import ChunkedPrefill
from sim.sequence import EngineKvCache, engine_limits
from sim.step_cost import StepCost
from sim.trained_model import TrainedModel
from sim.workload import Workload

log = logging.getLogger(__name__)


def resolve_cluster(
    spec: RunSpec,
    mode: ModeTraits,
    cost: SimCostModel,
    workload: Workload,
    allocation: AllocationPolicy,
) -> ClusterSection:
    """The cluster that runs: colocated modes share every GPU, allocation may re-split it
    (and stays on as the scaling rule of ``elastic``). What is worth a warning is logged
    (:func:`check_sim_run` holds it back and returns it)."""
    cluster = spec.cluster
    check_cluster(cluster, cost)
    check_kv_fit(spec, cost, workload, mode.colocated)
    check_prefill_budget(spec, workload, mode.colocated)
    if mode.colocated:
        _check_one_gpu_group(cluster, spec.pipeline.mode)
    trainer_gpus = total_gpus(cluster) if mode.colocated else cluster.trainer.num_gpus
    warning = check_trainer_memory(cost, cluster.trainer.hardware, trainer_gpus)
    if warning and mode.colocated:  # else about the trainer the allocation leaves (below)
        log.warning("%s", warning)
    for i, pool in enumerate(cluster.generation):
        if pool.tp > GPUS_PER_MACHINE:
            log.warning(
                "cluster.generation.%d.tp: %d spans more than one %d-GPU machine; the "
                "simulator prices its tensor-parallel all-reduces (two per layer) as rings "
                "through the node NIC (cluster.network.intra_dc_gbps, %g Gbit/s), at full "
                "rate with no contention (docs/sim-engine.md), so such an instance may run "
                "slower than simulated",
                i, pool.tp, GPUS_PER_MACHINE, spec.cluster.network.intra_dc_gbps,
            )  # fmt: skip
    if mode.colocated:
        pool = cluster.generation[0]
        total = total_gpus(cluster)
        colocated = cluster.model_copy(
            update={
                "generation": [pool.model_copy(update={"num_gpus": total})],
                "trainer": cluster.trainer.model_copy(update={"num_gpus": total}),
            }
        )
        return colocated
    model = stage_model(spec, mode, cost, workload)
    allocated = allocation.allocate(cluster, model)
    _warn_trainer_memory(
        cost, spec, allocated.trainer, resized=isinstance(allocation, BalancedAllocation)
    )
    given, ran = split_metrics(cluster), split_metrics(allocated)
    if ran != given:  # in run.log: the split that runs is not the spec's
        log.info(
            "policies.allocation %s: generation %d GPUs, trainer %d (the spec gave %d, %d)",
            spec.policies.allocation, ran["generation_gpus"], ran["trainer_gpus"],
            given["generation_gpus"], given["trainer_gpus"],
        )  # fmt: skip
    return allocated


def stage_model(
    spec: RunSpec, mode: ModeTraits, cost: SimCostModel, workload: Workload
) -> StageModel:
    """Allocation's stage model of a run of ``spec``: the simulator's own costs (prefill,
    KV cache, optimizer step) and, for a mode whose batches drain, the spec's dispatch
    (``policies.dispatch_shares``)."""
    cluster = spec.cluster
    bound = mode.staleness_bound(spec.pipeline.max_lag, spec.pipeline.steps_per_generation)
    batch_size, prompt_tokens = spec.algorithm.batch_size, workload.mean_prompt_tokens
    output_tokens = workload.sample_lengths(4096)
    shares = None if mode.continuous else batch_shares(spec, cost, output_tokens, prompt_tokens)
    return StageModel(
        cost=cost,
        batch_size=batch_size,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        micro_batch_per_gpu=spec.algorithm.micro_batch_per_gpu,
        min_trainer_gpus=min_trainer_gpus(cost, cluster.trainer.hardware),
        step_cost=StepCost.of(spec, cost),
        prefill=ChunkedPrefill(cost),
        kv_cache=EngineKvCache(cost.kv_capacity_tokens),
        stages_overlap=mode.stages_overlap(bound),
        continuous_lag=bound if mode.continuous else None,  # steps never wait for a drain
        shares=shares,
        batches_overlap=mode.stages_overlap(bound) and bound > 0 and not mode.continuous,
    )


def batch_shares(
    spec: RunSpec, cost: SimCostModel, output_tokens: np.ndarray, prompt_tokens: float
) -> BatchShares:
    """The spec's dispatch and predictor over a batch at the workload's quantiles, which
    the stage model splits (``policies.dispatch_shares``); random draws from named streams."""
    rngs = RngStreams(spec.run.seed)

    def predicted_batch() -> Batch:
        batch = quantile_batch(output_tokens, spec.algorithm.batch_size, prompt_tokens)
        exact = OraclePredictor(batch.true_tokens)  # stands in for a learned ranker
        rng = rngs.get("stage-model-predictor")
        predictor = build_predictor(spec, batch.true_tokens, rng, list(output_tokens), exact)
        return batch.predicted_by(predictor)

    return BatchShares(
        lambda: build_dispatch(spec, cost, rngs.get("stage-model-dispatch")),  # same draws
        cost.kv_capacity_tokens,
        predicted_batch,
        spreads=spec.policies.dispatch not in STACKING_DISPATCH,
    )


def _warn_trainer_memory(
    cost: SimCostModel, spec: RunSpec, trainer: TrainerPool, resized: bool
) -> None:
    """The offload warning about the trainer that runs: where the allocation picks its
    size (``resized``: ``balanced``), the allocation's trainer, named as such."""
    key = "cluster.trainer.num_gpus"
    if resized:
        key = f"policies.allocation {spec.policies.allocation}'s trainer"
    if warning := check_trainer_memory(cost, trainer.hardware, trainer.num_gpus, key):
        log.warning("%s", warning)


def total_gpus(cluster: ClusterSection) -> int:
    return sum(p.num_gpus for p in cluster.generation) + cluster.trainer.num_gpus


def _check_one_gpu_group(cluster: ClusterSection, mode: str) -> None:
    """A colocated mode runs both stages on every GPU: refuse GPUs of several kinds or
    datacenters (they would all run as the first pool's)."""
    first = cluster.generation[0]
    others = [(f"cluster.generation.{i}", p) for i, p in enumerate(cluster.generation)][1:]
    for key, part in [*others, ("cluster.trainer", cluster.trainer)]:
        if (part.hardware, part.datacenter) != (first.hardware, first.datacenter):
            raise ValueError(
                f"pipeline.mode: {mode} runs generation and training on the same GPUs, so "
                f"they must be one kind in one datacenter; {key} is {part.hardware} in "
                f"{part.datacenter}, cluster.generation.0 {first.hardware} in "
                f"{first.datacenter}: choose a disaggregated mode or one GPU group"
            )


# Training state a parameter, fully sharded over the trainer's GPUs (FSDP/ZeRO-3): bf16
# weights and gradients stay on the GPUs (4 bytes) even with the optimizer offloaded to the
# host; fp32 master weights and Adam's two moments add 12 more. Activations come on top.
ON_GPU_BYTES_PER_PARAM = 4
FULL_STATE_BYTES_PER_PARAM = 16


def trained_model(cost: SimCostModel) -> TrainedModel | None:
    """The model ``cost`` trains, as far as memory goes: the roofline model's shape, or what
    a calibrated model built for a spec knows (``CalibratedCostModel.for_spec``); None for
    a calibrated model loaded without one."""
    if isinstance(cost, RooflineCostModel):
        m = cost.model
        return TrainedModel(m.name, m.num_params, cost.num_trained_models, cost.gpu_table)
    return cost.trained if isinstance(cost, CalibratedCostModel) else None


def min_trainer_gpus(
    cost: SimCostModel, hardware_name: str, bytes_per_param: int = ON_GPU_BYTES_PER_PARAM
) -> int:
    """The fewest GPUs of ``hardware_name`` whose memory holds ``bytes_per_param`` for each
    trained parameter (1 where the model or the hardware is unknown: a calibrated model
    loaded without a spec, hardware the table does not list, such as a CPU)."""
    trained = trained_model(cost)
    hw = None if trained is None else trained.gpu(hardware_name)
    if trained is None or hw is None:
        return 1  # unknown: check_cluster's
    need = bytes_per_param * trained.num_params * trained.num_trained_models
    return max(1, math.ceil(need / hw.hbm_bytes))


def check_trainer_memory(
    cost: SimCostModel,
    hardware_name: str,
    num_gpus: int,
    key: str = "cluster.trainer.num_gpus",  # in a colocated mode every GPU
) -> str | None:
    """Refuse a trainer of ``num_gpus`` that cannot hold its weights and gradients; the
    warning when only an offloaded optimizer would fit (the simulator does not price
    offloading), or None. ``key`` names where ``num_gpus`` came from."""
    trained = trained_model(cost)
    if trained is None:
        return None
    models = " for each of 2 models" if trained.num_trained_models > 1 else ""
    floor = min_trainer_gpus(cost, hardware_name)
    if num_gpus < floor:
        raise ValueError(
            f"{key}: {num_gpus} {hardware_name} GPU(s) cannot hold {trained.name}'s bf16 "
            f"weights and gradients ({ON_GPU_BYTES_PER_PARAM} bytes a parameter{models}, "
            f"fully sharded); it needs at least {floor}"
        )
    full = min_trainer_gpus(cost, hardware_name, FULL_STATE_BYTES_PER_PARAM)
    if num_gpus >= full:
        return None
    return (
        f"{key}: {num_gpus} {hardware_name} GPU(s) hold {trained.name}'s training state "
        f"({FULL_STATE_BYTES_PER_PARAM} bytes a parameter{models}) only with the optimizer "
        f"offloaded to the host, which the simulator does not price; {full} hold it all"
    )


def check_cluster(cluster: ClusterSection, cost: SimCostModel) -> None:
    """Refuse, naming the spec key, hardware the cost model has no figures for (the
    roofline models read hardware.csv; a calibrated model knows only its own) and a pool
    whose tensor-parallel size leaves its model no KV cache."""
    if isinstance(cost, RooflineCostModel):
        known = cost.gpu_table  # hardware.csv and the spec's sim.hardware
        named = [(f"cluster.generation.{i}", p.hardware) for i, p in enumerate(cluster.generation)]
        for key, name in [*named, ("cluster.trainer", cluster.trainer.hardware)]:
            if name not in known:
                raise ValueError(
                    f"{key}.hardware: unknown hardware {name!r}; known: {', '.join(known)}"
                )
    for i, pool in enumerate(cluster.generation):
        try:
            cost.kv_capacity_tokens(Device(pool.hardware, pool.tp))
        except (ModelDoesNotFit, TpDoesNotShard) as err:
            raise ValueError(f"cluster.generation.{i}.tp: {err}") from None


def check_sim_run(spec: RunSpec) -> list[str]:
    """Refuse, before anything is written, what a simulated run of ``spec`` would refuse at
    its start: everything :func:`resolve_cluster` checks (hardware, tp, KV caches, the
    trainer's memory, a colocated mode's GPUs, the allocation policy's pools). Returns what
    the run will warn about (a trainer that fits only with its optimizer offloaded, a cost
    model that does not record its setup), without logging it: the run itself logs it."""
    with held_warnings() as held:
        workload = Workload(spec, RngStreams(spec.run.seed))
        cost = build_cost_model(spec)
        resolve_cluster(spec, mode_of(spec), cost, workload, build_allocation(spec))
    return held


def check_kv_fit(spec: RunSpec, cost: SimCostModel, workload: Workload, colocated: bool) -> None:
    """Refuse a pool whose instance's KV cache cannot hold the longest prompt with the
    largest ``max_tokens``, as vLLM refuses a ``max_model_len`` its KV cache cannot hold
    (a colocated mode runs only the first pool's instances, on every GPU)."""
    longest = workload.longest_sequence_tokens
    pools = spec.cluster.generation[:1] if colocated else spec.cluster.generation
    for pool in pools:
        if (problem := kv_shortfall(pool, cost, longest)) is not None:
            raise ValueError(_kv_problem(spec, pool, cost, problem))


def check_prefill_budget(spec: RunSpec, workload: Workload, colocated: bool) -> None:
    """Refuse a pool with chunked prefill off whose step budget cannot prefill the longest
    sequence in one step, as vLLM refuses ``max_num_batched_tokens`` below
    ``max_model_len`` without chunked prefill: a request preempted near its end recomputes
    its prompt and its output so far in one step (the scheduler's run-time error stays as
    a backstop)."""
    longest = workload.longest_sequence_tokens
    pools = spec.cluster.generation[:1] if colocated else spec.cluster.generation
    for i, pool in enumerate(pools):
        if pool.enable_chunked_prefill or pool.max_num_batched_tokens >= longest:
            continue
        key, value = max_tokens_key(spec)
        raise ValueError(
            f"cluster.generation.{i}.max_num_batched_tokens: {pool.max_num_batched_tokens} "
            f"tokens a step cannot prefill the longest prompt with its max_tokens "
            f"({longest} tokens) with cluster.generation.{i}.enable_chunked_prefill false "
            "(a preempted request recomputes it all in one step; vLLM refuses a budget "
            f"below max_model_len without chunked prefill); raise it to {longest}, set "
            f"cluster.generation.{i}.enable_chunked_prefill=true, or lower {key} ({value})"
        )


def _kv_problem(spec: RunSpec, pool: GenerationPool, cost: SimCostModel, problem: str) -> str:
    """``problem`` under the key that sizes the KV cache (a calibrated model's is its
    measured ``kv_capacity_tokens``: its tp is the profiled one, not the spec's tp), with
    the workload key that sets the longest ``max_tokens``, the other lever."""
    key, value = max_tokens_key(spec)
    if isinstance(cost, CalibratedCosts) and not pool.num_gpu_blocks_override:
        return (
            f"sim.cost_model: {problem}: the cost model {cost.path} gives each instance "
            f"kv_capacity_tokens {cost.kv_capacity} (from the profile's profile.json); check "
            f"that value, or lower {key} ({value})"
        )
    return kv_too_small(spec, pool, problem)


def kv_too_small(spec: RunSpec, pool: GenerationPool, problem: object) -> str:
    """A sequence that does not fit ``pool``'s KV cache, naming both levers: the key that
    sizes the cache (``tp`` or ``num_gpu_blocks_override``) and the ``max_tokens`` key."""
    sizes = kv_cache_key(spec.cluster, pool)
    key, value = max_tokens_key(spec)
    return f"{sizes}: {problem}; raise {sizes} (it sizes the cache) or lower {key} ({value})"


def kv_shortfall(pool: GenerationPool, cost: SimCostModel, longest: int) -> str | None:
    """Why an instance of ``pool`` cannot hold a sequence of ``longest`` tokens (prompt and
    output), or None where it can."""
    limits = engine_limits(pool, cost.kv_capacity_tokens(Device(pool.hardware, pool.tp)))
    need = blocks_for(longest - 1, limits.block_size)  # the last token's KV is never kept
    if need <= limits.num_blocks:
        return None
    capacity = limits.num_blocks * limits.block_size
    return (
        f"the longest prompt with its max_tokens ({longest} tokens, {need} blocks) does not "
        f"fit one instance's KV cache ({limits.num_blocks} blocks of {limits.block_size} "
        f"tokens, {capacity} tokens)"
    )


def kv_cache_key(cluster: ClusterSection, pool: GenerationPool) -> str:
    """The spec key that sizes ``pool``'s KV cache: its block override where set, else tp."""
    i = cluster.generation.index(pool)
    name = "num_gpu_blocks_override" if pool.num_gpu_blocks_override else "tp"
    return f"cluster.generation.{i}.{name}"


def max_tokens_key(spec: RunSpec) -> tuple[str, int]:
    """The workload key, and its value, that sets the largest ``max_tokens`` of a run:
    ``final_max_output_tokens`` where the max grows to it, else ``max_output_tokens``."""
    w = spec.workload
    final = w.final_max_output_tokens
    if final is not None and final > w.max_output_tokens and spec.run.iterations > 1:
        return "workload.final_max_output_tokens", final
    return "workload.max_output_tokens", w.max_output_tokens
