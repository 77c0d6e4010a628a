"""Resource allocation between generation and training (StreamRL §4).

* ``fixed`` keeps the cluster as written.
* ``balanced`` (StreamRL Alg. 1) enumerates (generation GPUs, training GPUs) splits of one
  datacenter's pool and keeps the one minimising ``max(T_gen, T_train)`` (ties: the smaller
  ``T_gen + T_train``, then the fewer trainer GPUs). That is the iteration time where the
  stages overlap (a streaming trainer, or a staleness bound above 0). Where they take
  turns (``disagg-sync``: ``StageModel.stages_overlap`` False) an iteration takes
  ``T_gen + T_train``, so that sum is minimised first. Where the next batch starts while
  one drains (``stream-async``, ``one-step-async``), splits within 1 % of the least are
  tied, and the one whose generation capacity keeps up best wins
  (:mod:`policies.split_search`). When generation and training sit
  in different datacenters (or on different hardware) GPUs cannot move between the
  stages, so the faster stage is shrunk until the two stage times match (only where the
  stages overlap: in turns a smaller stage would lengthen the iteration), and the trainer
  to the GPUs one batch can keep busy. Neither leaves the trainer fewer GPUs than its
  memory needs (``StageModel.min_trainer_gpus``).
* ``elastic`` starts as ``fixed`` and, after each iteration, adds generation instances
  when ``Δ = T_gen − T_train`` exceeds ``Δ′``, the time one more node of instances would save.


Stage times, ``T_gen`` per optimizer step and ``T_train``, come from
:class:`policies.stage_model.StageModel`.
"""

from __future__ import annotations

import logging
from enum import Enum
from functools import partial
from typing import Protocol

from policies.cluster import ClusterSection, GenerationPool
from policies.registry import Factories, Registry
from policies.split_search import SplitPricing, best_split
from policies.stage_model import StageModel

log = logging.getLogger(__name__)


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
        """The split minimising the iteration (:func:`policies.split_search.best_split`);
        the spec's where no split leaves the trainer the GPUs its memory needs."""
        total = pool.num_gpus + cluster.trainer.num_gpus
        pricing = SplitPricing(
            generation_s=partial(model.step_generation_s, pool),
            floor_s=partial(model.generation_floor_s, pool),
            training_s=partial(model.training_s, pool.hardware),
            capacity_s=partial(model.even_generation_s, pool),
        )
        gens = range(pool.tp, total - model.min_trainer_gpus + 1, pool.tp)
        best = best_split(gens, total, pricing, model.stages_overlap, model.batches_overlap)
        return best or (pool.num_gpus, cluster.trainer.num_gpus)

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
