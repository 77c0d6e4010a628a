"""Resource allocation between generation and training (StreamRL §4).

* ``fixed`` keeps the cluster as written.
* ``balanced`` (StreamRL Alg. 1) enumerates (generation GPUs, training GPUs) splits of one
  datacenter's pool and keeps the one minimising ``max(T_gen, T_train)`` (ties: the smaller
  ``T_gen + T_train``, then the fewer trainer GPUs). That is the iteration time where the
  stages overlap (a streaming trainer, or a staleness bound above 0). Where they take
  turns (``disagg-sync``: ``StageModel.stages_overlap`` False) an iteration takes
  ``T_gen + T_train``, so that sum is minimised first. When generation and training sit
  in different datacenters (or on different hardware) GPUs cannot move between the
  stages, so the faster stage is shrunk until the two stage times match (only where the
  stages overlap: in turns a smaller stage would lengthen the iteration), and the trainer
  to the GPUs one batch can keep busy. Neither leaves the trainer fewer GPUs than its
  memory needs (``StageModel.min_trainer_gpus``).
* ``elastic`` starts as ``fixed`` and, after each iteration, adds generation instances
  when ``Δ = T_gen − T_train`` exceeds ``Δ′``, the time one more node of instances would save.

Both take ``T_gen`` per optimizer step (``StageModel.step_generation_s``): a batch's, or for a
continuous mode (``pipeline``, which never waits for a batch to drain) the steady state's,
capacity or the longest request over ``lag + 1`` steps (:mod:`policies.steady_generation`).

Stage times come from :class:`StageModel`. An instance runs its share of the batch with
continuous batching (vLLM): while requests wait for one of its ``max_num_seqs`` slots,
every slot is busy and a step decodes one token for each; the last requests admitted then
drain as the batch shrinks (their lengths follow the workload's distribution, priced step
by step with the cost model's decode time, so the longest sequence's tail counts).
Generation time is thus continuous in the requests per instance, not a count of full
waves. A slot holds its sequence's KV, so an instance runs at most as many sequences as
its KV cache holds (``StageModel.kv_cache``: the simulated engine's own cache,
``sim.sequence.EngineKvCache``); the drain prefills again those it preempts
(:mod:`policies.decode_estimate`, which prices both phases). The iteration waits for the
instance that holds the batch's longest request, so
the drain's lengths are quantiles spaced ``1 / slots`` apart from the batch's longest, at
``(B − ½) / B`` of ``B`` requests (the plotting position the quantiles use): more
instances do not shorten the longest request. Before decoding, the engine prefills the
instance's prompts in steps of at most ``max_num_batched_tokens``; the drain prices every
output token as a decode step, so the prefill adds its steps' prefill work
(``StageModel.prefill``: the simulator's own mixed-step cost, ``sim.prefill_cost``).
Known biases: outputs of one length finish together and so do run in waves, which the
full phase prices as if they did not (up to one drain short); requests are split evenly
by count, as ``round-robin`` dispatch does (``skewness-aware`` gathers the long tail on
fewer instances: their heavier tail batches the drain does not see, and their fewer
prompts it prefills as a full share, which dominates where prefill is slow, as on H20);
the other requests
on the slowest instance sit at the distribution's quantiles, not at a random draw's
(the slowest of several random shares is slower); each request prefills its own prompt
(prefix caching of GRPO siblings would save some). Training prices the batch's
tokens with the cost model on the GPUs the batch keeps busy
(:func:`policies.data_parallel.busy_trainer_gpus`: at most one per micro-batch of
``micro_batch_per_gpu`` samples), as the simulator's trainer does, and adds what the
trainer pays once per optimizer step on all its GPUs, the exposed gradient all-reduce and
the optimizer step (``StageModel.step_cost``: the simulator's own ``sim.step_cost``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from functools import partial
from typing import Protocol

import numpy as np

from policies.cluster import ClusterSection, GenerationPool
from policies.data_parallel import busy_trainer_gpus, micro_batches_per_gpu
from policies.decode_estimate import InstanceDecode
from policies.protocols import CostModel, Device
from policies.registry import Factories, Registry
from policies.steady_generation import SteadyDecode

log = logging.getLogger(__name__)


class OptimizerStepCost(Protocol):
    """What a trainer pays once per optimizer step beyond its forward and backward passes
    (the exposed gradient all-reduce and the optimizer step), in seconds."""

    def step_s(self, device: Device, num_samples: int, num_tokens: float) -> float:
        """A step of ``num_samples`` samples and ``num_tokens`` tokens on ``device``, every
        trainer GPU (those the batch does not keep busy hold gradients and state too)."""
        ...


class PrefillCost(Protocol):
    """What prefilling an instance's prompts adds to decoding its requests, in seconds."""

    def prefill_s(
        self, device: Device, num_prompts: int, prompt_tokens: float, max_batched_tokens: int
    ) -> float:
        """``num_prompts`` prompts of ``prompt_tokens`` each, at most ``max_batched_tokens``
        prefill tokens an engine step."""
        ...


class KvCache(Protocol):
    """The KV cache of a pool's instances, in tokens."""

    def kv_tokens(self, pool: GenerationPool) -> int:
        """Tokens of KV (prompts and outputs) one instance of ``pool`` holds."""
        ...


@dataclass(slots=True)
class StageModel:
    """Per-iteration stage times of a batch, from a cost model and sampled lengths."""

    cost: CostModel
    batch_size: int
    prompt_tokens: float
    output_tokens: Sequence[int]  # a sample of output lengths (any size)
    micro_batch_per_gpu: int = 1  # samples per trainer GPU per micro-batch
    min_trainer_gpus: int = 1  # the fewest whose memory holds the training state
    step_cost: OptimizerStepCost | None = None  # None: forward and backward alone
    prefill: PrefillCost | None = None  # None: decode alone
    stages_overlap: bool = True  # False: an iteration takes T_gen + T_train in turn
    kv_cache: KvCache | None = None  # None: an instance's KV cache holds any batch
    continuous_lag: int | None = None  # a continuous mode's staleness bound; None: batches drain

    def step_generation_s(self, pool: GenerationPool, num_gpus: int | None = None) -> float:
        """Generation time one optimizer step costs: a batch's (:meth:`generation_s`), or in
        a continuous mode the steady state's (:mod:`policies.steady_generation`)."""
        if self.continuous_lag is None:
            return self.generation_s(pool, num_gpus)
        kv_tokens = None if self.kv_cache is None else self.kv_cache.kv_tokens(pool)
        prefill = None if self.prefill is None else partial(self._prefill_s, pool)
        steady = SteadyDecode(
            self.cost, Device(pool.hardware, pool.tp), self.prompt_tokens, self.output_tokens,
            pool.max_num_seqs, kv_tokens, prefill,
        )  # fmt: skip
        instances = (num_gpus or pool.num_gpus) // pool.tp
        return steady.step_s(self.batch_size, instances, self.continuous_lag)

    def generation_s(self, pool: GenerationPool, num_gpus: int | None = None) -> float:
        """Time for ``num_gpus`` of ``pool`` to prefill and generate one batch split evenly
        (:mod:`policies.decode_estimate`)."""
        instances = (num_gpus or pool.num_gpus) // pool.tp
        if instances <= 0:
            return math.inf
        per_instance = math.ceil(self.batch_size / instances)
        slots = min(per_instance, pool.max_num_seqs)
        decode = self._instance_decode(pool)
        decode_s = decode.full_s(per_instance - slots, slots)
        decode_s += decode.drain_s(slots, self.batch_size)
        return self._prefill_s(pool, per_instance, self.prompt_tokens) + decode_s

    def _instance_decode(self, pool: GenerationPool) -> InstanceDecode:
        """Decoding on an instance of ``pool``: its KV cache (``kv_cache``) and the prefill
        that recomputes what it preempts (``prefill``)."""
        kv_tokens = None if self.kv_cache is None else self.kv_cache.kv_tokens(pool)
        recompute = None if self.prefill is None else partial(self._prefill_s, pool)
        device = Device(pool.hardware, pool.tp)
        return InstanceDecode(
            self.cost, device, self.prompt_tokens, self.output_tokens, kv_tokens, recompute
        )

    def _prefill_s(self, pool: GenerationPool, num_prompts: int, prompt_tokens: float) -> float:
        if self.prefill is None:
            return 0.0
        device, budget = Device(pool.hardware, pool.tp), pool.max_num_batched_tokens
        return self.prefill.prefill_s(device, num_prompts, prompt_tokens, budget)

    def training_s(self, hardware: str, num_gpus: int) -> float:
        """One optimizer step of one batch on ``num_gpus``: its forward and backward
        (:meth:`forward_backward_s`) and what the step adds on every GPU (``step_cost``)."""
        train_s = self.forward_backward_s(hardware, num_gpus)
        if self.step_cost is None:
            return train_s
        device = Device(hardware, num_gpus)
        return train_s + self.step_cost.step_s(device, self.batch_size, self.batch_tokens)

    def forward_backward_s(self, hardware: str, num_gpus: int) -> float:
        """Forward and backward of one batch on ``num_gpus``, of which only as many as the
        batch has micro-batches do work (``busy_trainer_gpus``)."""
        busy = self.busy_trainer_gpus(num_gpus)
        calls = micro_batches_per_gpu(busy, self.batch_size, self.micro_batch_per_gpu)
        return self.cost.train_s(Device(hardware, busy), int(self.batch_tokens), calls)

    @property
    def batch_tokens(self) -> float:
        """Prompt and output tokens of one batch, at the mean lengths."""
        return self.batch_size * (self.prompt_tokens + float(np.mean(self.output_tokens)))

    def busy_trainer_gpus(self, num_gpus: int) -> int:
        """Of ``num_gpus`` trainer GPUs, those one batch keeps busy: one per micro-batch."""
        return busy_trainer_gpus(num_gpus, self.batch_size, self.micro_batch_per_gpu)


class AllocationPolicy(Protocol):
    def allocate(self, cluster: ClusterSection, model: StageModel) -> ClusterSection: ...


ALLOCATION: Factories[AllocationPolicy] = Registry("allocation")


@ALLOCATION.register("fixed")
class FixedAllocation:
    def allocate(self, cluster: ClusterSection, model: StageModel) -> ClusterSection:
        return cluster


def _single_pool(cluster: ClusterSection, allocation: str) -> GenerationPool:
    if len(cluster.generation) != 1:
        raise ValueError(
            f"policies.allocation {allocation!r} supports one generation pool, not "
            f"{len(cluster.generation)} (cluster.generation): use 'fixed'"
        )
    return cluster.generation[0]


@ALLOCATION.register("balanced")
class BalancedAllocation:
    def allocate(self, cluster: ClusterSection, model: StageModel) -> ClusterSection:
        pool = _single_pool(cluster, "balanced")
        same_place = (
            pool.datacenter == cluster.trainer.datacenter
            and pool.hardware == cluster.trainer.hardware
        )
        if same_place:
            gen, train = self._best_split(pool, cluster, model)
        else:
            gen, train = self._shrink_faster(pool, cluster, model)
        return cluster.model_copy(
            update={
                "generation": [pool.model_copy(update={"num_gpus": gen})],
                "trainer": cluster.trainer.model_copy(update={"num_gpus": train}),
            }
        )

    @staticmethod
    def _best_split(
        pool: GenerationPool, cluster: ClusterSection, model: StageModel
    ) -> tuple[int, int]:
        """The split minimising the iteration: the slower stage, then the sum of the stage
        times (the sum first where the stages take turns); among equal ones the fewer
        trainer GPUs (a batch that cannot keep more busy gives the rest to generation
        rather than to an idle trainer)."""
        total = pool.num_gpus + cluster.trainer.num_gpus
        best = (pool.num_gpus, cluster.trainer.num_gpus)
        best_key = (math.inf, math.inf, total)
        for gen in range(pool.tp, total - model.min_trainer_gpus + 1, pool.tp):
            t_gen, t_train = (
                model.step_generation_s(pool, gen),
                model.training_s(pool.hardware, total - gen),
            )
            slower, both = max(t_gen, t_train), t_gen + t_train
            key = (slower, both) if model.stages_overlap else (both, slower)
            key = (*key, total - gen)
            if key < best_key:
                best, best_key = (gen, total - gen), key
        return best

    @staticmethod
    def _shrink_faster(
        pool: GenerationPool, cluster: ClusterSection, model: StageModel
    ) -> tuple[int, int]:
        gen, train = pool.num_gpus, cluster.trainer.num_gpus
        if not model.stages_overlap:  # a smaller stage would only lengthen the iteration
            return gen, max(model.min_trainer_gpus, model.busy_trainer_gpus(train))
        t_gen = model.step_generation_s(pool, gen)
        t_train = model.training_s(cluster.trainer.hardware, train)
        if t_gen < t_train:
            while (
                gen - pool.tp >= pool.tp and model.step_generation_s(pool, gen - pool.tp) <= t_train
            ):
                gen -= pool.tp
        else:
            trainer_hw = cluster.trainer.hardware
            floor = model.min_trainer_gpus
            while train > floor and model.training_s(trainer_hw, train - 1) <= t_gen:
                train -= 1
        return gen, max(model.min_trainer_gpus, model.busy_trainer_gpus(train))


class Decline(Enum):
    """Why elastic added no instance after an iteration (logged once per change)."""

    AT_CAP = "policies.elastic.max_extra_instances are already added"
    KEEPS_UP = "generation took no longer than training"
    NO_SAVING = "more instances are predicted to save nothing (the long tail sets the time)"
    OVERSHOOT = "the predicted saving exceeds the gap to training (it would overshoot)"


@ALLOCATION.register("elastic")
class ElasticAllocation:
    """Fixed at the start; :meth:`instances_to_add` and :meth:`instances_to_retire` are the
    controller's scaling rule.

    ``Δ′`` scales the measured generation time by the stage model's predicted saving from
    ``k`` more instances, so the long tail (which more instances cannot shorten) counts.
    With ``retire``, ``k`` instances go when generation on ``k`` fewer — the measured time
    scaled up by the same stage model — would still take no longer than training: then
    they only idle. The two rules cannot undo each other: an addition leaves generation
    longer than training (it never overshoots), a retirement leaves it no longer.

    Each addition and retirement is logged at INFO (``time_s``: when the controller
    decided, in the run's clock), and so is a declined addition whenever its reason
    (:class:`Decline`) differs from the last one logged.
    """

    def __init__(
        self, max_extra_instances: int = 4, instances_per_step: int = 1, retire: bool = False
    ) -> None:
        self.max_extra_instances = max_extra_instances
        self.instances_per_step = instances_per_step
        self.retire = retire
        self.added = 0
        self._model: StageModel | None = None
        self._pool: GenerationPool | None = None
        self._last_decline: Decline | None = None

    def allocate(self, cluster: ClusterSection, model: StageModel) -> ClusterSection:
        self._model, self._pool = model, _single_pool(cluster, "elastic")
        return cluster

    def instances_to_add(
        self,
        gen_time_s: float,
        train_time_s: float,
        num_instances: int,
        *,
        time_s: float | None = None,
    ) -> int:
        k = min(self.instances_per_step, self.max_extra_instances - self.added)
        saving_s = gen_time_s * self._saving(num_instances, k) if k > 0 else 0.0
        why = _why_not_add(k, gen_time_s - train_time_s, saving_s)
        if why is not None:
            self._log_decline(why, time_s, gen_time_s, train_time_s, num_instances)
            return 0
        self.added += k
        self._last_decline = None
        log.info(
            "elastic%s: %d → %d generation instances (generation %.1f s, training %.1f s; "
            "predicted saving %.1f s)",
            _at(time_s), num_instances, num_instances + k, gen_time_s, train_time_s, saving_s,
        )  # fmt: skip
        return k

    def instances_to_retire(
        self,
        gen_time_s: float,
        train_time_s: float,
        num_instances: int,
        *,
        time_s: float | None = None,
    ) -> int:
        k = min(self.instances_per_step, num_instances - 1)
        if not self.retire or k <= 0:
            return 0
        fewer = num_instances - k
        slower_s = gen_time_s / max(1e-9, 1.0 - self._saving(fewer, k))
        if slower_s > train_time_s:
            return 0
        log.info(
            "elastic%s: retiring %d → %d generation instances (generation %.1f s, training "
            "%.1f s; predicted generation on %d: %.1f s)",
            _at(time_s), num_instances, fewer, gen_time_s, train_time_s, fewer, slower_s,
        )  # fmt: skip
        return k

    def _log_decline(
        self, why: Decline, time_s: float | None, gen_s: float, train_s: float, n: int
    ) -> None:
        if why == self._last_decline:
            return
        self._last_decline = why
        log.info(
            "elastic%s: keeps %d generation instances (generation %.1f s, training %.1f s): %s",
            _at(time_s), n, gen_s, train_s, why.value,
        )  # fmt: skip

    def _saving(self, num_instances: int, k: int) -> float:
        """Fraction of generation time ``k`` more instances would save."""
        if self._model is None or self._pool is None:
            return k / (num_instances + k)
        tp = self._pool.tp
        now = self._model.step_generation_s(self._pool, num_instances * tp)
        more = self._model.step_generation_s(self._pool, (num_instances + k) * tp)
        return max(0.0, 1.0 - more / now) if now > 0 else 0.0


def _why_not_add(k: int, delta_s: float, saving_s: float) -> Decline | None:
    """Why ``k`` more instances should not come when generation exceeds training by
    ``delta_s`` and they would save ``saving_s`` (``Δ′``); None if they should."""
    if k <= 0:
        return Decline.AT_CAP
    if delta_s <= 0:
        return Decline.KEEPS_UP
    if saving_s <= 0:
        return Decline.NO_SAVING
    return Decline.OVERSHOOT if delta_s <= saving_s else None


def _at(time_s: float | None) -> str:
    return "" if time_s is None else f" at {time_s:.1f} s"
