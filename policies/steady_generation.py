"""What generation costs an optimizer step when it never drains: the stage model's estimate
for continuous modes (``pipeline``; :attr:`policies.modes.base.ModeTraits.continuous`),
used by ``balanced`` and ``elastic`` (:meth:`policies.stage_model.StageModel.step_generation_s`).

A batch-synchronous mode waits for each batch to drain to its longest request, so a step
costs the batch's generation time (``StageModel.generation_s``). Continuous generation
refills a slot as soon as its sample finishes, and the lag budget (``pipeline.max_lag``)
trains a sample within ``lag + 1`` optimizer steps of its start. With every instance
running ``r`` sequences, a decode step taking ``t(r)``, a step of ``T`` seconds is bounded
twice:

* capacity: a step consumes ``batch_size`` samples, so an instance decodes its share of
  one batch's tokens every step, ``T ≥ ⌈B / instances⌉ × E[L] × t(r) / r``;
* the tail: the batch's longest request (``L_max``, the length quantile at ``(B − ½) / B``,
  as the drain takes it) starts and finishes within ``lag + 1`` steps,
  ``T ≥ L_max × t(r) / (lag + 1)``.

More sequences raise throughput and slow every sequence, so capacity falls with ``r`` and
the tail rises. The lag budget counts samples, not time: it lets ``(lag + 1) × B`` be in
flight, started and not yet trained. Where an instance's share of them exceeds what it
holds (``max_num_seqs``, or fewer where the KV cache holds fewer), its queue never empties
and every sequence it holds runs: ``r`` is that many. Otherwise the samples that finished
and wait for their step take part of the count, and ``r`` settles where the step is
shortest: the least ``max`` over ``r`` up to the instance's share. Prefilling the
instance's share of one batch's prompts adds to either. A running sequence is a
length-biased one halfway through, of mean context ``prompt + E[L²] / (2 E[L])``, as
``InstanceDecode.full_s``. ``experiments.advise_estimate`` prices ``pipeline`` as
``max(T_cap, T_gen / (lag + 1))``: capacity at the most sequences in flight and the tail
at one batch's, two concurrencies that do not hold at once (an optimistic estimate, which
its search corrects by the errors it measures).

Known biases: below the engine's limit the budget throttles starts but does not pick
``r``, so the least ``max`` is the best it can reach (optimistic); weight loads pause
decode in flight, which neither bound sees (optimistic); the tail at the engine's limit
takes the longest request to run beside a full engine all its life (pessimistic: the
sim's streamrl-7b at 20K tokens, lag 4, 16 + 16 H800 steps in 121 s against 131 s); the
first steps, before any overlap, cost more; requests are split evenly by count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from policies.protocols import CostModel, Device


@dataclass(frozen=True, slots=True)
class SteadyDecode:
    """Continuous decoding on the instances of one pool (``device`` each)."""

    cost: CostModel
    device: Device
    prompt_tokens: float
    output_tokens: Sequence[int]  # a sample of output lengths (any size)
    max_num_seqs: int  # an instance's slots
    kv_tokens: int | None = None  # an instance's KV cache; None: it holds any batch
    # seconds to prefill (num_prompts, prompt_tokens each) on one instance; None: free
    prefill_s: Callable[[int, float], float] | None = None

    def step_s(self, batch_size: int, instances: int, max_lag: int) -> float:
        """One optimizer step's generation on ``instances`` instances at staleness
        ``max_lag``: ``max(capacity, tail)`` at the sequences that run."""
        if instances <= 0:
            return math.inf
        per_instance = math.ceil(batch_size / instances)
        lengths = np.asarray(self.output_tokens, float)
        mean_tokens = float(lengths.mean())
        context = self.prompt_tokens + float((lengths**2).mean()) / (2 * mean_tokens)
        longest = float(np.quantile(lengths, 1 - 0.5 / batch_size))
        in_flight = math.ceil((max_lag + 1) * batch_size / instances)
        held = min(self.max_num_seqs, self._kv_seqs(context))

        def bounds(running: int) -> tuple[float, float]:  # (capacity, tail)
            step_s = self.cost.decode_step_s(self.device, running, int(running * context))
            return per_instance * mean_tokens * step_s / running, longest * step_s / (max_lag + 1)

        if in_flight > held:  # the engine's queue never empties: every sequence it holds runs
            decode_s = max(bounds(held))
        else:
            crossing = _first(lambda r: bounds(r)[1] >= bounds(r)[0], in_flight)
            decode_s = min(max(bounds(r)) for r in {crossing, max(1, crossing - 1)})
        if self.prefill_s is None:
            return decode_s
        return decode_s + self.prefill_s(per_instance, self.prompt_tokens)

    def _kv_seqs(self, context_tokens: float) -> int:
        if self.kv_tokens is None:
            return self.max_num_seqs
        return max(1, int(self.kv_tokens // max(1.0, context_tokens)))


def _first(holds: Callable[[int], bool], most: int) -> int:
    """The least ``r`` in ``1..most`` where ``holds`` (true from some ``r`` on), else ``most``."""
    lo, hi = 1, most
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if holds(mid) else (mid + 1, hi)
    return lo
