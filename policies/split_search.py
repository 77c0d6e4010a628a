"""``balanced``'s search over the splits of one pool of GPUs between generation and
training (:class:`policies.allocation.BalancedAllocation`).

Each split is ranked by its iteration time: the slower stage where the stages overlap,
their sum where they take turns (the *primary* time); among equal ones the other of the
two, then the fewer trainer GPUs (a batch that cannot keep more busy gives the rest to
generation rather than to an idle trainer).

Where the next batch starts while this one drains (a staleness bound above 0, in a mode
whose batches drain: ``stream-async``, ``one-step-async``; ``StageModel.batches_overlap``),
the generation estimate, one batch priced alone, is not the step's time: the instances
that finish their share early start the next batch. Where the slowest instance holds the
long tail (``skewness-aware`` gathers it on a few instances), that estimate is flat over
the splits, and the sum would break the tie towards the trainer, leaving generation short
of the capacity the overlap uses. So among the splits whose primary time lies within
``TIE_TOLERANCE`` of the least, these modes take the one whose slower stage is least when
generation is priced at its capacity, the batch split evenly over every instance
(``StageModel.even_generation_s``). ``TIE_TOLERANCE`` is the estimate's own resolution:
1 %, its mean error against the simulator under ``skewness-aware``
(``tests/test_stage_model_fidelity.py``); splits closer than that it cannot rank.

Generation priced under the run's dispatch costs a dispatch and a pricing of every
instance's share, so the search is best first: splits in order of a lower bound on their
primary time (``StageModel.generation_floor_s`` for generation; training is cheap and
priced exactly), each priced only while that bound can still reach the band of the best
found. Training only slows as generation takes GPUs, so the splits with the most
generation GPUs are never priced once training alone is slower than the best split. A
split left unpriced cannot rank first, so the search returns what pricing every split
would (``tests/test_allocation_ties.py`` checks both). The floor is a lower bound only for a
cost model whose decode step meets its premise (:mod:`policies.floor_premise`, checked once
a pool shape); for one that does not, such as a calibrated fit whose token costs more in a
full batch, the floor is 0 and every split is priced (``tests/test_floor_premise.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

TIE_TOLERANCE = 0.01  # relative: the stage model's mean error under skewness-aware


@dataclass(frozen=True, slots=True)
class SplitTimes:
    """One split's stage times, in seconds."""

    generation_gpus: int
    trainer_gpus: int
    generation_s: float
    training_s: float

    def primary_s(self, overlap: bool) -> float:
        """The iteration: the slower stage where the stages overlap, else their sum."""
        return _primary(self.generation_s, self.training_s, overlap)

    def key(self, overlap: bool) -> tuple[float, float, int]:
        slower = max(self.generation_s, self.training_s)
        both = self.generation_s + self.training_s
        first, second = (slower, both) if overlap else (both, slower)
        return first, second, self.trainer_gpus


@dataclass(frozen=True, slots=True)
class SplitPricing:
    """What the search asks of the stage model for ``gen`` generation GPUs of the pool."""

    generation_s: Callable[[int], float]  # one optimizer step's generation
    floor_s: Callable[[int], float]  # a lower bound on generation_s, cheap
    training_s: Callable[[int], float]  # training on the GPUs the split leaves it
    capacity_s: Callable[[int], float]  # generation at its capacity (the tie-break)


def best_split(
    gens: Iterable[int],
    total: int,
    pricing: SplitPricing,
    overlap: bool,
    batches_overlap: bool,
) -> tuple[int, int] | None:
    """The best (generation, trainer) split of ``total`` GPUs over ``gens``; None if none."""
    priced = _priced(list(gens), total, pricing, overlap, batches_overlap)
    if not priced:
        return None
    best = min(priced, key=lambda s: s.key(overlap))
    if batches_overlap:
        best = _tie_break(priced, best, pricing, overlap)
    return best.generation_gpus, best.trainer_gpus


def _priced(
    gens: list[int], total: int, pricing: SplitPricing, overlap: bool, batches_overlap: bool
) -> list[SplitTimes]:
    """The splits that can rank first, priced in order of their lower bound."""
    tolerance = TIE_TOLERANCE if batches_overlap else 0.0
    train = {gen: pricing.training_s(total - gen) for gen in gens}
    bound = {gen: _primary(pricing.floor_s(gen), train[gen], overlap) for gen in gens}
    priced: list[SplitTimes] = []
    best_s = math.inf
    for gen in sorted(gens, key=lambda g: (bound[g], total - g)):
        if bound[gen] > best_s * (1 + tolerance):
            break
        split = SplitTimes(gen, total - gen, pricing.generation_s(gen), train[gen])
        priced.append(split)
        best_s = min(best_s, split.primary_s(overlap))
    return priced


def _tie_break(
    priced: list[SplitTimes], best: SplitTimes, pricing: SplitPricing, overlap: bool
) -> SplitTimes:
    """Of the splits within ``TIE_TOLERANCE`` of ``best``, the one whose slower stage is
    least with generation at its capacity; then by the usual key."""
    limit_s = best.primary_s(overlap) * (1 + TIE_TOLERANCE)
    tied = [s for s in priced if s.primary_s(overlap) <= limit_s]
    return min(
        tied,
        key=lambda s: (max(pricing.capacity_s(s.generation_gpus), s.training_s), s.key(overlap)),
    )


def _primary(generation_s: float, training_s: float, overlap: bool) -> float:
    if overlap:
        return max(generation_s, training_s)
    return generation_s + training_s
