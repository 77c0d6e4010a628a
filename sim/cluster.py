"""The cluster a simulated run uses: colocated modes share every GPU, and the allocation
policy may re-split the spec's cluster between generation and training."""

from __future__ import annotations

from policies.allocation import AllocationPolicy, StageModel
from policies.cluster import ClusterSection
from policies.modes import ModeTraits
from policies.spec import RunSpec
from sim.costs import SimCostModel
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
