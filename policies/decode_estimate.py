"""How long one generation instance decodes its share of a batch: the stage model's
estimate (``policies.stage_model.StageModel.generation_s``), from the cost model's decode
step alone.

The instance runs continuous batching (vLLM). While requests wait, every slot is busy and
a step decodes one token for each (:meth:`InstanceDecode.full_s`); the last requests
admitted then drain as the batch shrinks (:meth:`InstanceDecode.drain_s`). A slot holds a
sequence's KV, its prompt and the tokens it has generated so far, so the engine runs at
most as many sequences as its KV cache holds (``kv_tokens``): fewer than ``max_num_seqs``
where outputs are long. The engine then preempts the lowest-priority sequences and
resumes them when others finish, recomputing their KV. Decoding is priced as if it were
work-conserving: the tokens a phase decodes are fixed, and they take ``running`` a step,
where ``running = min(sequences, kv_tokens // context)`` at the phase's mean context a
sequence. Each sequence the drain's cache stops holding is preempted once, and its KV
(its context then) is prefilled again when it resumes (``recompute_s``).

Known biases: the sequences still to finish are taken to have progressed together, where
the engine lets the high-priority ones run ahead, so the context of those it resumes is
overestimated (fewer run a step than do); a sequence is preempted only once, where the
engine may preempt it again after it resumes (more recomputation); the full phase
recomputes nothing, where the engine admits a waiting request whenever its prompt fits
and then preempts; a cache sized by blocks is taken as tokens (a sequence's last block
is partly empty).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from policies.protocols import CostModel, Device


@dataclass(frozen=True, slots=True)
class InstanceDecode:
    """Decoding on one instance (``device``) whose KV cache holds ``kv_tokens`` tokens."""

    cost: CostModel
    device: Device
    prompt_tokens: float
    output_tokens: Sequence[int]  # a sample of output lengths (any size)
    kv_tokens: int | None = None  # None: the cache holds any batch
    # seconds to prefill again (num_seqs, context_tokens each) preempted sequences; None: free
    recompute_s: Callable[[int, float], float] | None = None

    def running(self, num_seqs: int, context_tokens: float) -> int:
        """Sequences of ``context_tokens`` each that decode at once, of ``num_seqs``."""
        if self.kv_tokens is None:
            return num_seqs
        return max(1, min(num_seqs, int(self.kv_tokens // max(1.0, context_tokens))))

    def full_s(self, num_queued: int, slots: int) -> float:
        """Decode the tokens of ``num_queued`` requests that wait for one of ``slots``
        (continuous batching: each takes the slot of one that finished, so every slot stays
        busy until the queue is empty). A slot then holds a length-biased sequence, of mean
        context ``prompt + E[L²] / (2 E[L])``, as ``experiments.reproduce.analytic``; as many
        run as the KV cache holds."""
        if num_queued <= 0:
            return 0.0
        lengths = np.asarray(self.output_tokens, float)
        mean_tokens = float(lengths.mean())
        per_slot = self.prompt_tokens + float((lengths**2).mean()) / (2 * mean_tokens)
        running = self.running(slots, per_slot)
        steps = num_queued * mean_tokens / running
        return steps * self.cost.decode_step_s(self.device, running, int(running * per_slot))

    def drain_s(self, batch: int, batch_size: int) -> float:
        """Generate ``batch`` sequences admitted together: the batch shrinks as they finish.
        Their lengths are those of the instance holding the longest request of the
        ``batch_size`` requests: quantiles ``1 / batch`` apart from that longest, at
        ``(B − ½) / B``. Between two finishes, the sequences still running have all grown
        by the same tokens; where the KV cache holds fewer of them, their tokens take more
        steps (:meth:`running`)."""
        top = 1 - 0.5 / max(batch, batch_size)
        qs = np.quantile(np.asarray(self.output_tokens, float), top - np.arange(batch) / batch)
        return self.drain_lengths_s(np.maximum(1, np.round(qs)).astype(int))

    def drain_lengths_s(self, output_tokens: Sequence[int]) -> float:
        """Generate sequences of ``output_tokens`` each, admitted together (the drain of
        :meth:`drain_s`, of lengths given)."""
        lengths = np.sort(np.asarray(output_tokens, int))
        batch = len(lengths)
        total, done, num_waiting = 0.0, 0, 0
        for j, length in enumerate(lengths):
            if length > done:
                num_seqs, per_seq = batch - j, self.prompt_tokens + (done + length) / 2
                running = self.running(num_seqs, per_seq)
                total += self._segment_s(num_seqs, running, int(length) - done, per_seq)
                total += self._recompute_s(num_seqs - running - num_waiting, per_seq)
                done, num_waiting = int(length), num_seqs - running
        return total

    def _segment_s(self, num_seqs: int, running: int, num_tokens: int, per_seq: float) -> float:
        """``num_seqs`` sequences of mean context ``per_seq`` decode ``num_tokens`` each,
        ``running`` at a time."""
        steps = num_tokens * num_seqs / running
        return steps * self.cost.decode_step_s(self.device, running, int(running * per_seq))

    def _recompute_s(self, num_preempted: int, context_tokens: float) -> float:
        if num_preempted <= 0 or self.recompute_s is None:
            return 0.0
        return self.recompute_s(num_preempted, context_tokens)
