"""The stage model: what one iteration's generation and training take on a split of the
cluster, for the allocation policies (:mod:`policies.allocation`).

Stage times come from :class:`StageModel`. The batch is split over the instances as the
run's own dispatch policy splits it (``StageModel.shares``, :mod:`policies.dispatch_shares`:
``skewness-aware`` gathers the long tail on a few instances with small batches), or,
without one, evenly by count, as ``round-robin`` does; the iteration waits for the
slowest instance. An instance runs its share with continuous batching (vLLM): while
requests wait for one of its ``max_num_seqs`` slots, every slot is busy and a step decodes
one token for each; the last requests admitted then drain as the batch shrinks (their
lengths spaced ``1 / slots`` apart from the instance's longest, priced step by step with
the cost model's decode time, so the longest sequence's tail counts). Generation time is
thus continuous in the requests per instance, not a count of full waves. A slot holds its
sequence's KV, so an instance runs at most as many sequences as its KV cache holds
(``StageModel.kv_cache``: the simulated engine's own, ``sim.sequence.EngineKvCache``); the
drain prefills again those it preempts (:mod:`policies.decode_estimate`). Split evenly, the
drain's lengths are the workload's quantiles from the batch's longest, at ``(B − ½) / B``
of ``B`` requests (more instances do not shorten the longest request). Before decoding,
the engine prefills the instance's prompts in steps of at most ``max_num_batched_tokens``
(``StageModel.prefill``: the simulator's own mixed-step cost, ``sim.prefill_cost``).
Known biases: outputs of one length finish together and so do run in waves, which the
full phase prices as if they did not (up to one drain short); the batch's lengths are
quantiles, dealt to the dispatch longest first, so ``round-robin`` deals each instance a
stratified share where the run deals random ones (the slowest of several random shares
is slower), and one batch is priced alone, where the overlapping modes start the next on
the instances that finish first (:mod:`policies.dispatch_shares`); each request prefills
its own prompt (prefix caching of GRPO siblings would save some). Training prices the
batch's tokens with the cost model on the GPUs the batch keeps busy
(:func:`policies.data_parallel.busy_trainer_gpus`: at most one per micro-batch of
``micro_batch_per_gpu`` samples), as the simulator's trainer does, and adds what the
trainer pays once per optimizer step on all its GPUs, the exposed gradient all-reduce and
the optimizer step (``StageModel.step_cost``: the simulator's own ``sim.step_cost``).

``balanced`` and ``elastic`` take ``T_gen`` per optimizer step
(``StageModel.step_generation_s``): a batch's, or for a continuous mode (``pipeline``,
which never waits for a batch to drain) the steady state's, capacity or the longest
request over ``lag + 1`` steps (:mod:`policies.steady_generation`). ``balanced`` also asks
for a cheap lower bound on it (``generation_floor_s``; 0 where the cost model breaks the
premise that makes it one, :mod:`policies.floor_premise`), to skip the splits that cannot
win, and for the batch split evenly (``even_generation_s``), the capacity its tie-break
weighs (:mod:`policies.split_search`). Dispatching and pricing a batch is cached per
pool shape and instance count, and an instance's pricing per set of lengths, in the
model's own dictionaries (one model per run).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import numpy as np

from policies.cluster import GenerationPool
from policies.data_parallel import busy_trainer_gpus, micro_batches_per_gpu
from policies.decode_estimate import InstanceDecode
from policies.dispatch_shares import BatchShares, share_s
from policies.floor_premise import floor_premise_holds
from policies.protocols import CostModel, Device
from policies.steady_generation import SteadyDecode

EXACT_INSTANCES = 128  # up to this many instances the batch is dispatched at every count
DISPATCH_GRID = 1.1  # beyond, at counts this ratio apart (interpolated between)

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
    shares: BatchShares | None = None  # the run's dispatch and batch; None: even by count
    batches_overlap: bool = False  # the next batch starts while this one drains (bound > 0)
    _dispatched: dict[tuple[object, ...], float] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )  # generation_s by pool shape and instance count
    _priced_shares: dict[tuple[object, ...], float] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )  # one instance's time by pool shape and its lengths (instance counts share many)
    _floor_holds: dict[tuple[object, ...], bool] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )  # whether the cost model meets the floor's premise, by pool shape

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
        """Time for ``num_gpus`` of ``pool`` to prefill and generate one batch, split as the
        run's dispatch splits it (``shares``) or evenly by count
        (:meth:`even_generation_s`)."""
        instances = (num_gpus or pool.num_gpus) // pool.tp
        if instances <= 0:
            return math.inf
        if self.shares is not None:
            return self._dispatched_s(pool, instances)
        return self.even_generation_s(pool, num_gpus)

    def even_generation_s(self, pool: GenerationPool, num_gpus: int | None = None) -> float:
        """One batch split evenly by count over the instances, as ``round-robin`` splits it:
        the batch's work at the instances' capacity (:mod:`policies.decode_estimate`)."""
        instances = (num_gpus or pool.num_gpus) // pool.tp
        if instances <= 0:
            return math.inf
        per_instance = math.ceil(self.batch_size / instances)
        slots = min(per_instance, pool.max_num_seqs)
        decode = self._instance_decode(pool)
        decode_s = decode.full_s(per_instance - slots, slots)
        decode_s += decode.drain_s(slots, self.batch_size)
        return self._prefill_s(pool, per_instance, self.prompt_tokens) + decode_s

    def generation_floor_s(self, pool: GenerationPool, num_gpus: int | None = None) -> float:
        """A lower bound on :meth:`step_generation_s` that dispatches nothing: under the
        run's dispatch, the batch's tokens at the fewest seconds a token (every slot busy,
        each sequence at ``prompt + mean / 2`` tokens of context) spread over every
        instance, and the longest request decoded alone. 0 where generation is cheap to
        price (no ``shares``, or a continuous mode), and where the cost model's decode step
        breaks the premise that makes this a lower bound (:mod:`policies.floor_premise`)."""
        instances = (num_gpus or pool.num_gpus) // pool.tp
        if self.shares is None or self.continuous_lag is not None or instances <= 0:
            return 0.0
        if not self._floor_premise_holds(pool):  # pricing every split is exact
            return 0.0
        device, slots = Device(pool.hardware, pool.tp), pool.max_num_seqs
        lengths = self.shares.batch.lengths
        context = int(self.prompt_tokens + float(lengths.mean()) / 2)
        token_s = self.cost.decode_step_s(device, slots, slots * context) / slots
        capacity_s = float(lengths.sum()) * token_s / instances
        longest = int(lengths.max())
        longest_s = longest * self.cost.decode_step_s(
            device, 1, int(self.prompt_tokens + longest / 2)
        )
        return max(capacity_s, longest_s)

    def _floor_premise_holds(self, pool: GenerationPool) -> bool:
        """:func:`policies.floor_premise.floor_premise_holds` for an instance of ``pool``
        over the batch's contexts, checked once a pool shape (and logged where it fails)."""
        key = self._pool_key(pool)
        if key not in self._floor_holds:
            assert self.shares is not None
            prompt, longest = int(self.prompt_tokens), int(self.shares.batch.lengths.max())
            device = Device(pool.hardware, pool.tp)
            holds = floor_premise_holds(
                self.cost, device, pool.max_num_seqs, prompt, prompt + longest
            )
            if not holds:
                log.info(
                    "balanced: the cost model's decode step on %s × %d (max_num_seqs %d) "
                    "breaks the generation floor's premise (policies.floor_premise), so the "
                    "split search prices every split of this pool",
                    pool.hardware, pool.tp, pool.max_num_seqs,
                )  # fmt: skip
            self._floor_holds[key] = holds
        return self._floor_holds[key]

    def _dispatched_s(self, pool: GenerationPool, instances: int) -> float:
        """The slowest instance's prefill and decode of the lengths ``shares`` assigns it
        (:mod:`policies.dispatch_shares`). Instances beyond the batch's requests hold none
        where the dispatch spreads the batch (``BatchShares.spreads``); ``random`` is
        dispatched over them all. Beyond ``EXACT_INSTANCES`` the batch is dispatched at
        counts ``DISPATCH_GRID`` apart and the time between them interpolated (a 16384-GPU
        pool would otherwise dispatch a batch thousands of times)."""
        assert self.shares is not None
        if self.shares.spreads:  # the instances beyond the batch's requests hold none
            instances = min(instances, self.batch_size)
        if instances <= EXACT_INSTANCES:
            return self._dispatched_at(pool, instances)
        below = EXACT_INSTANCES
        while (above := math.ceil(below * DISPATCH_GRID)) < instances:
            below = above
        if self.shares.spreads:  # else a grid point past the pool: its dispatch is cached
            above = min(above, self.batch_size)
        low_s, high_s = self._dispatched_at(pool, below), self._dispatched_at(pool, above)
        return low_s + (high_s - low_s) * (instances - below) / (above - below)

    def _dispatched_at(self, pool: GenerationPool, instances: int) -> float:
        """:meth:`_dispatched_s` at one count, dispatched once a pool shape and count (the
        instances that hold nothing take no time)."""
        key = (*self._pool_key(pool), instances)
        if key not in self._dispatched:
            assert self.shares is not None
            own_shares = self.shares.shares(pool, instances)
            busy = [own for own in own_shares if len(own)]
            self._dispatched[key] = max((self._share_s(pool, own) for own in busy), default=0.0)
        return self._dispatched[key]

    def _share_s(self, pool: GenerationPool, lengths: np.ndarray) -> float:
        """One instance's prefill and decode of its own ``lengths``, once a pool shape and
        set of lengths (the long tail's instances hold the same over many counts)."""
        own = np.sort(lengths)[::-1]
        key = (*self._pool_key(pool), own.tobytes())
        if key not in self._priced_shares:
            decode = self._instance_decode(pool)
            prefill_s = self._prefill_s(pool, len(own), self.prompt_tokens)
            self._priced_shares[key] = prefill_s + share_s(decode, own, pool.max_num_seqs)
        return self._priced_shares[key]

    def _pool_key(self, pool: GenerationPool) -> tuple[object, ...]:
        kv_tokens = None if self.kv_cache is None else self.kv_cache.kv_tokens(pool)
        return pool.hardware, pool.tp, pool.max_num_seqs, pool.max_num_batched_tokens, kv_tokens

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
