"""How many of the trainer's GPUs a batch keeps busy, shared by the simulator's trainer
(``sim.trainer``) and the allocation's stage model (``policies.stage_model.StageModel``).

Data parallelism as the live trainer runs it (``runtime.sharded_trainer``): the samples
of a forward/backward job are cut into micro-batches of ``algorithm.micro_batch_per_gpu``
samples (a sample is never split) and each GPU trains whole micro-batches. ``n`` samples
make ``ceil(n / micro_batch_per_gpu)`` micro-batches, so no more than that many GPUs have
work; the others only wait at the gradient all-reduce. Extra GPUs past that add nothing.
"""

from __future__ import annotations

import math


def busy_trainer_gpus(num_gpus: int, num_samples: int, micro_batch_per_gpu: int) -> int:
    """GPUs of a ``num_gpus`` trainer that ``num_samples`` samples keep busy (at least 1):
    ``min(num_gpus, ceil(num_samples / micro_batch_per_gpu))``."""
    assert num_gpus >= 1, num_gpus
    return min(num_gpus, num_micro_batches(num_samples, micro_batch_per_gpu))


def micro_batches_per_gpu(busy_gpus: int, num_samples: int, micro_batch_per_gpu: int) -> int:
    """Micro-batches (forward and backward calls) the busiest of ``busy_gpus`` runs for
    ``num_samples`` samples (at least 1): ``ceil(ceil(num_samples / micro_batch_per_gpu) /
    busy_gpus)``. A cost model with a fixed cost per call pays it that many times."""
    assert busy_gpus >= 1, busy_gpus
    return math.ceil(num_micro_batches(num_samples, micro_batch_per_gpu) / busy_gpus)


def num_micro_batches(num_samples: int, micro_batch_per_gpu: int) -> int:
    """Micro-batches of ``micro_batch_per_gpu`` samples that ``num_samples`` make (at least 1)."""
    assert micro_batch_per_gpu >= 1, micro_batch_per_gpu
    return math.ceil(max(1, num_samples) / micro_batch_per_gpu)
