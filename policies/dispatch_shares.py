"""Which of one batch's output lengths each generation instance decodes, as the run's own
dispatch policy assigns them: the split of a batch that ``StageModel.generation_s`` prices
when it is given :class:`BatchShares`.

The batch is ``B`` output lengths at the workload's quantiles, at the plotting positions
``(k + ½) / B`` (its longest at ``(B − ½) / B``, as the drain of
:mod:`policies.decode_estimate` takes it), predicted once by the spec's own length
predictor (:meth:`Batch.predicted_by`: ``oracle`` exactly, ``noisy-oracle`` with its
calibrated noise, ``none`` not at all; the executor builds it, with its random draws from
a named stream). It arrives all at once, longest first, at idle instances of one pool,
and a fresh dispatch policy, built as the run builds it, assigns it. Each instance then
prefills its own prompts and decodes its own lengths (:func:`share_s`); the batch takes
as long as the slowest instance.

Known biases: the executor may stand an exact predictor in for a learned ranker
(``sim.cluster.stage_model`` does), so the long requests a ranker puts among the regular
ones (which then run on instances with big batches) are not seen; the noise of
``noisy-oracle`` is one draw, not the run's; the batch's lengths are the quantiles, not
a random draw (its longest is the expected one, not that of the batch the run draws);
the run's batch arrives in no particular order, so ``round-robin`` and ``least-loaded``
deal random shares where this deals them longest first (``round-robin``: the stratified,
count-even shares of ``experiments.advise_estimate``; the slowest of several random
shares is slower); one batch is priced alone, where the overlapping modes start the next
on the instances that finish first (they gain from instances that do not shorten one
batch: ``policies.split_search`` breaks the ties this leaves towards generation). A
continuous mode (``pipeline``) is priced at its steady state
(:mod:`policies.steady_generation`), not with this. Where the dispatch gives no instance a
second request while another idles (``BatchShares.spreads``: every policy but ``random``),
the stage model takes the instances beyond the batch's requests to hold none and prices
them at the batch's count; ``random``, which may stack requests on one instance while
others idle, it dispatches over every instance. Beyond 128 instances it dispatches at
counts 10 % apart and interpolates (``StageModel._dispatched_s``), so ``random``'s one
draw at each of those counts stands for the counts between them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from policies.cluster import GenerationPool
from policies.decode_estimate import InstanceDecode
from policies.dispatch import DispatchPolicy
from policies.protocols import Device, LengthPredictor
from policies.records import InstanceView, Request

KvCapacity = Callable[[Device], int]  # KV-cache tokens an instance of this device holds


@dataclass(frozen=True, slots=True)
class Batch:
    """One batch's output lengths, longest first, and its requests in that order (request
    ``k``, ``sample_id`` ``k``, is ``lengths[k]`` long)."""

    lengths: np.ndarray
    requests: list[Request]

    def true_tokens(self, request: Request) -> int:
        """A request's true output length (the truth an ``oracle`` predictor is given)."""
        return int(self.lengths[request.sample_id])

    def predicted_by(self, predictor: LengthPredictor) -> Batch:
        """This batch with its requests' lengths predicted once by ``predictor``."""
        predictions = predictor.predict(self.requests)
        requests = [r.with_prediction(p) for r, p in zip(self.requests, predictions)]
        return Batch(self.lengths, requests)


@dataclass(slots=True)
class BatchShares:
    """The run's dispatch, to split a batch over a pool's instances."""

    new_dispatch: Callable[[], DispatchPolicy]  # a fresh policy, built as the run builds it
    kv_capacity_tokens: KvCapacity  # an instance's KV cache, which its view shows dispatch
    new_batch: Callable[[], Batch]  # the batch to split (:func:`quantile_batch`), predicted
    spreads: bool = True  # no request goes to a busy instance while one idles (not ``random``)
    _batch: Batch | None = field(default=None, init=False, repr=False)

    @property
    def batch(self) -> Batch:
        """The batch, built when first asked for (a ``noisy-oracle`` calibrates its noise
        then): a ``fixed`` run never asks."""
        if self._batch is None:
            self._batch = self.new_batch()
        return self._batch

    def shares(self, pool: GenerationPool, num_instances: int) -> list[np.ndarray]:
        """The lengths each of ``num_instances`` instances of ``pool`` decodes."""
        kv_tokens = self.kv_capacity_tokens(Device(pool.hardware, pool.tp))
        views = [
            InstanceView(i, pool.hardware, pool.tp, pool.datacenter, pool.max_num_seqs, kv_tokens)
            for i in range(num_instances)
        ]
        ids = np.asarray(self.new_dispatch().assign(self.batch.requests, views))
        order = np.argsort(ids, kind="stable")  # by instance, each in the batch's order
        starts = np.searchsorted(ids[order], np.arange(num_instances + 1))
        lengths = self.batch.lengths[order]
        return [lengths[starts[i] : starts[i + 1]] for i in range(num_instances)]


def quantile_batch(output_tokens: Sequence[int], batch_size: int, prompt_tokens: float) -> Batch:
    """``batch_size`` requests at the quantiles ``(k + ½) / batch_size`` of a sample of
    output lengths (linear between its order statistics), longest first, not predicted."""
    ordered = np.sort(np.asarray(output_tokens, float))
    positions = (batch_size - 0.5 - np.arange(batch_size)) / batch_size * (len(ordered) - 1)
    qs = np.interp(positions, np.arange(len(ordered)), ordered)
    lengths = np.maximum(1, np.round(qs)).astype(int)
    prompt, max_tokens = max(1, round(prompt_tokens)), int(lengths[0])
    requests = [Request(k, k, k, 0, prompt, max_tokens) for k in range(batch_size)]
    return Batch(lengths, requests)


def share_s(decode: InstanceDecode, lengths: np.ndarray, max_num_seqs: int) -> float:
    """Decode one instance's own ``lengths``: while requests wait, every slot is busy, at the
    moments of its own lengths; the last ``slots`` admitted then drain, at its own lengths
    spaced ``1 / slots`` apart from its longest (:meth:`InstanceDecode.drain_s`'s rule)."""
    num_requests = len(lengths)
    if num_requests == 0:
        return 0.0
    slots = min(num_requests, max_num_seqs)
    own = np.sort(lengths)[::-1]
    drain = own[(np.arange(slots) * num_requests) // slots]
    decode = replace(decode, output_tokens=own)
    return decode.full_s(num_requests - slots, slots) + decode.drain_lengths_s(drain)
