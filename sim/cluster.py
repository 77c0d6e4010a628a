"""The cluster a simulated run uses: colocated modes share every GPU, and the allocation
policy may re-split the spec's cluster between generation and training."""

from __future__ import annotations

from policies.allocation import AllocationPolicy, StageModel
from policies.build import mode_of
from policies.cluster import ClusterSection, GenerationPool
from policies.modes import ModeTraits
from policies.protocols import Device
from policies.rng import RngStreams
from policies.spec import RunSpec
from sim.costs import ModelDoesNotFit, RooflineCostModel, SimCostModel, build_cost_model
from sim.kv_cache import blocks_for
from sim.sequence import engine_limits
from sim.tables import hardware_table
from sim.workload import Workload


def resolve_cluster(
    spec: RunSpec,
    mode: ModeTraits,
    cost: SimCostModel,
    workload: Workload,
    allocation: AllocationPolicy,
) -> ClusterSection:
    """The cluster that runs: colocated modes share every GPU, allocation may re-split it
    (and stays on as the scaling rule of ``elastic``)."""
    cluster = spec.cluster
    check_cluster(cluster, cost)
    check_kv_fit(spec, cost, workload)
    if mode.colocated:
        pool = cluster.generation[0]
        total = sum(p.num_gpus for p in cluster.generation) + cluster.trainer.num_gpus
        colocated = cluster.model_copy(
            update={
                "generation": [pool.model_copy(update={"num_gpus": total})],
                "trainer": cluster.trainer.model_copy(update={"num_gpus": total}),
            }
        )
        return colocated
    model = StageModel(
        cost=cost,
        batch_size=spec.algorithm.batch_size,
        prompt_tokens=workload.mean_prompt_tokens,
        output_tokens=workload.sample_lengths(4096),
        micro_batch_per_gpu=spec.algorithm.micro_batch_per_gpu,
    )
    return allocation.allocate(cluster, model)


def check_cluster(cluster: ClusterSection, cost: SimCostModel) -> None:
    """Refuse, naming the spec key, hardware the cost model has no figures for (the
    roofline models read hardware.csv; a calibrated model knows only its own) and a pool
    whose tensor-parallel size leaves its model no KV cache."""
    if isinstance(cost, RooflineCostModel):
        known = hardware_table()
        named = [(f"cluster.generation.{i}", p.hardware) for i, p in enumerate(cluster.generation)]
        for key, name in [*named, ("cluster.trainer", cluster.trainer.hardware)]:
            if name not in known:
                raise ValueError(
                    f"{key}.hardware: unknown hardware {name!r}; known: {', '.join(known)}"
                )
    for i, pool in enumerate(cluster.generation):
        try:
            cost.kv_capacity_tokens(Device(pool.hardware, pool.tp))
        except ModelDoesNotFit as err:
            raise ValueError(f"cluster.generation.{i}.tp: {err}") from None


def check_sim_run(spec: RunSpec) -> None:
    """Refuse, before anything is written, what a simulated run of ``spec`` would refuse at
    its start: hardware and tp (:func:`check_cluster`) and KV caches (:func:`check_kv_fit`)."""
    cost = build_cost_model(spec)
    check_cluster(spec.cluster, cost)
    check_kv_fit(spec, cost, Workload(spec, RngStreams(spec.run.seed)))


def check_kv_fit(spec: RunSpec, cost: SimCostModel, workload: Workload) -> None:
    """Refuse a pool whose instance's KV cache cannot hold the longest prompt with the
    largest ``max_tokens``, as vLLM refuses a ``max_model_len`` its KV cache cannot hold."""
    longest = workload.longest_sequence_tokens
    colocated = mode_of(spec).colocated  # runs the first pool's instances on every GPU
    pools = spec.cluster.generation[:1] if colocated else spec.cluster.generation
    for pool in pools:
        limits = engine_limits(pool, cost.kv_capacity_tokens(Device(pool.hardware, pool.tp)))
        need = blocks_for(longest - 1, limits.block_size)  # the last token's KV is never kept
        if need > limits.num_blocks:
            raise ValueError(
                f"{kv_cache_key(spec.cluster, pool)}: the longest prompt with its max_tokens "
                f"({longest} tokens, {need} blocks) does not fit one instance's KV cache "
                f"({limits.num_blocks} blocks of {limits.block_size} tokens)"
            )


def kv_cache_key(cluster: ClusterSection, pool: GenerationPool) -> str:
    """The spec key that sizes ``pool``'s KV cache: its block override where set, else tp."""
    i = cluster.generation.index(pool)
    name = "num_gpu_blocks_override" if pool.num_gpu_blocks_override else "tp"
    return f"cluster.generation.{i}.{name}"
