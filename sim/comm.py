"""Collective communication of the simulator, from first principles: the tensor-parallel
all-reduces of every engine step and the trainer's gradient all-reduce.

Modelling assumptions (each with its source; nothing here is fitted to a measured or
published throughput):

* **Ring all-reduce** (the bandwidth-optimal algorithm NCCL runs for large messages;
  Patarasuk & Yuan 2009): each of ``n`` GPUs sends (and receives) ``2 (n-1)/n`` of the
  bytes, so the time is ``2 (n-1)/n · bytes / bandwidth + latency``. The bandwidth term is
  the lower bound: full link rate, no protocol overhead.
* **NVLink per direction**: hardware.csv's ``nvlink_gb_per_s`` is the datasheet's total
  bidirectional figure (H100: 18 links × 50 GB/s = 900 GB/s; StreamRL's Table 1 lists H800
  at 400 and H20 at 900 the same way); a ring sends and receives at once, each at half of
  it (H100: 450 GB/s each way).
* **Across machines** (more GPUs than :data:`GPUS_PER_MACHINE`): the ring is ordered by
  machine, so each machine's outgoing edge carries one GPU's whole stream,
  ``2 (n-1)/n · bytes``, through the node NIC (``cluster.network.intra_dc_gbps``, per
  direction, as NIC line rates are stated); the slow hop sets the pace:
  ``min(NVLink per direction, NIC)``. Contention with other traffic on the NIC (weight
  pushes, other instances on the machine) is not modelled.
* **Latency**: NCCL's own latency model of a ring all-reduce with its low-latency (LL)
  protocol (``src/graph/tuning.cc``, ``ncclTopoTuneModel``: ``baseLat`` ring/LL 6.6 µs,
  plus ``hwLat`` per step, 0.6 µs over NVLink and 2.7 µs over the network, ``2 (n-1)``
  steps of which ``2 · machines`` cross the network when there is more than one machine).
  Taking the LL latency with the full link bandwidth makes the sum a lower bound of
  NCCL's own estimate (LL gets a fraction of the bandwidth, Simple a larger latency).
* **Tensor parallelism** (Megatron-LM, Shoeybi et al. 2019, as vLLM shards a model): two
  all-reduces per transformer layer in every forward pass, after the attention output
  projection and after the MLP (or mixture-of-experts) down projection, each of
  ``rows × hidden_size × 2`` bytes (bf16 activations); nothing overlaps them with compute.
  A term that depends on rows only, so decode time stays affine in context tokens
  (``sim.ticks.DecodeLaw``). Left out: the vocabulary-parallel embedding's all-reduce and
  the logits gather to the driver (one collective each per step), and, for a mixture of
  experts, expert parallelism (its all-to-all): experts are taken as sharded over the
  ``tp`` ranks like a dense MLP (vLLM's default without ``enable_expert_parallel``), so the
  MoE block ends with the same one all-reduce.
* **Gradient all-reduce** (data parallelism as PyTorch DDP and Megatron-LM run it, Li et
  al. 2020, "PyTorch Distributed"): bf16 gradients of every trained parameter, all-reduced
  once per optimizer step over every trainer GPU (gradient accumulation skips the sync
  on all but the last micro-batch: DDP's ``no_sync``, Megatron's
  ``forward_backward_no_pipelining``), in buckets of :data:`GRAD_BUCKET_BYTES` that start
  as soon as the backward pass has produced them. A fully sharded optimizer's
  reduce-scatter plus all-gather moves the same bytes. The backward pass and the
  all-reduce form a two-stage pipeline over ``k`` equal buckets, whose makespan is
  ``max(backward, all-reduce) + min(backward, all-reduce) / k``: what cannot hide behind
  the last micro-batch's backward is ``max(0, all-reduce − backward) + min(backward,
  all-reduce) / k`` (the last bucket).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.models import BYTES_PER_VALUE, Model
from sim.tables import Hardware

GPUS_PER_MACHINE = 8  # hardware.csv prices 8-GPU machines; more GPUs cross machines
# NCCL src/graph/tuning.cc (ncclTopoTuneModel's latency model, in µs there):
NCCL_RING_BASE_LATENCY_S = 6.6e-6  # baseLat[Ring][LL]
NCCL_NVLINK_STEP_LATENCY_S = 0.6e-6  # hwLat[NVLINK][Ring][LL], per ring step
NCCL_NET_STEP_LATENCY_S = 2.7e-6  # hwLat[NET][Ring][LL], per ring step across machines
GRAD_BUCKET_BYTES = 25 * 2**20  # torch DistributedDataParallel's bucket_cap_mb default, 25


@dataclass(frozen=True, slots=True)
class Fabric:
    """The links a collective over one kind of GPU crosses, in bytes/s per direction."""

    nvlink_bytes_per_s: float  # one GPU's NVLink, each way (half the datasheet's total)
    nic_bytes_per_s: float  # one machine's NIC, each way

    @classmethod
    def of(cls, hw: Hardware, intra_dc_gbps: float) -> Fabric:
        """``hw``'s NVLink and a node NIC of ``intra_dc_gbps`` gigabits per second."""
        return cls(hw.nvlink_bytes_per_s / 2, intra_dc_gbps * 1e9 / 8)


def num_machines(num_gpus: int) -> int:
    return math.ceil(num_gpus / GPUS_PER_MACHINE)


def ring_latency_s(num_gpus: int) -> float:
    """NCCL's latency of a ring all-reduce over ``num_gpus`` (LL protocol)."""
    steps = 2 * (num_gpus - 1)
    machines = num_machines(num_gpus)
    net_steps = 2 * machines if machines > 1 else 0
    return (
        NCCL_RING_BASE_LATENCY_S
        + (steps - net_steps) * NCCL_NVLINK_STEP_LATENCY_S
        + net_steps * NCCL_NET_STEP_LATENCY_S
    )


def ring_allreduce_s(num_bytes: float, num_gpus: int, fabric: Fabric) -> float:
    """One ring all-reduce of ``num_bytes`` over ``num_gpus`` GPUs (0 for one GPU)."""
    if num_gpus <= 1:
        return 0.0
    bandwidth = fabric.nvlink_bytes_per_s
    if num_machines(num_gpus) > 1:
        bandwidth = min(bandwidth, fabric.nic_bytes_per_s)
    moved = 2 * (num_gpus - 1) / num_gpus * num_bytes
    return moved / bandwidth + ring_latency_s(num_gpus)


def tensor_parallel_s(model: Model, rows: int, tp: int, fabric: Fabric) -> float:
    """The all-reduces of one engine step over ``rows`` tokens on ``tp`` GPUs: two per
    layer of ``rows × hidden_size`` bf16 values (0 at ``tp`` 1)."""
    if tp <= 1:
        return 0.0
    message_bytes = rows * model.hidden_size * BYTES_PER_VALUE
    return 2 * model.num_layers * ring_allreduce_s(message_bytes, tp, fabric)


def exposed_grad_allreduce_s(
    grad_bytes: float, num_gpus: int, backward_s: float, fabric: Fabric
) -> float:
    """The part of the gradient all-reduce over ``num_gpus`` that does not hide behind a
    backward pass of ``backward_s`` (bucketed, each bucket sent once it is ready)."""
    if num_gpus <= 1 or grad_bytes <= 0:
        return 0.0
    num_buckets = max(1, math.ceil(grad_bytes / GRAD_BUCKET_BYTES))
    allreduce_s = num_buckets * ring_allreduce_s(grad_bytes / num_buckets, num_gpus, fabric)
    return max(0.0, allreduce_s - backward_s) + min(allreduce_s, backward_s) / num_buckets
