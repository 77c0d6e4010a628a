"""Cheap estimates of a structure's throughput from the cost model alone (no simulation).

``T_gen`` drains one batch on the instance that holds its longest sample: requests are
dealt longest-first round the instances (as length-aware dispatch does), and that
instance runs them with continuous batching, ``min(max_num_seqs, what the KV cache
holds)`` at a time, longest first, each segment between two completions priced with the
cost model's decode step. ``T_train`` prices the batch's tokens on the trainer, with the
step's exposed gradient all-reduce and optimizer step (:class:`policies.stage_model.StageModel`
with ``sim.step_cost``, as the simulated trainer pays them). A mode combines them:

* ``colocated-sync``: ``T_gen + T_train + 2 × context switch`` on every GPU;
* ``disagg-sync``, ``conventional``: ``T_gen + T_train`` (no overlap);
* ``stream-sync``, ``one-step-async``, ``stream-async``: perfect overlap ``max(T_gen, T_train)``;
* ``pipeline``: ``max(T_cap, T_train, T_gen / (lag + 1))``, where ``T_cap`` is the batch's
  tokens at the instances' decode rate with every slot busy (continuous generation has no
  per-batch tail, but a sample may span at most ``lag + 1`` steps).

The first iteration of a mode that overlaps the stages has nothing to overlap with
(``T_gen + T_train``, or ``max`` when streaming), so a run of ``I`` steps is priced as
the first plus ``I - 1`` steady ones.

These are estimates, not bounds: they ignore dispatch skew, the warm-up iteration and
weight pushes. The search (``experiments.advise_search``) learns how far each mode and
policy sits from its estimate and stays optimistic by the largest error it has seen.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from experiments.advise_space import Inventory, Structure
from policies.modes import MODES
from policies.protocols import Device
from policies.rng import RngStreams
from policies.spec import RunSpec
from policies.stage_model import StageModel
from sim.cluster import min_trainer_gpus
from sim.costs import SimCostModel, build_cost_model
from sim.step_cost import StepCost
from sim.tables import hardware_of
from sim.workload import Workload

NUM_LENGTH_SAMPLES = 4096


def drain_s(
    cost: SimCostModel, device: Device, lengths: np.ndarray, slots: int, prompt_tokens: float
) -> float:
    """Continuous batching of ``lengths`` (admitted in order, ``slots`` at a time): the
    time until the last one finishes, each segment between completions priced at its
    batch size and mean context."""
    finish: list[int] = []  # decode-step counts at which running sequences finish
    total_s, step, admitted = 0.0, 0, 0
    per_seq = prompt_tokens + float(np.mean(lengths)) / 2
    while admitted < len(lengths) or finish:
        while admitted < len(lengths) and len(finish) < slots:
            heapq.heappush(finish, step + int(lengths[admitted]))
            admitted += 1
        running = len(finish)
        nxt = heapq.heappop(finish)
        context = int(running * per_seq)
        total_s += (nxt - step) * cost.decode_step_s(device, running, context)
        step = nxt
        while finish and finish[0] == step:
            heapq.heappop(finish)
    return total_s


@dataclass(slots=True)
class Estimator:
    spec: RunSpec
    inventory: Inventory
    stages: StageModel
    cost: SimCostModel
    longest_tokens: int = 0  # the workload's longest prompt with its max_tokens
    _drains: dict[tuple[str, int, int, int], float] = field(default_factory=dict)

    @classmethod
    def of(cls, spec: RunSpec) -> Estimator:
        cost = build_cost_model(spec)
        workload = Workload(spec, RngStreams(spec.run.seed))
        stages = StageModel(
            cost=cost,
            batch_size=spec.algorithm.batch_size,
            prompt_tokens=workload.mean_prompt_tokens,
            output_tokens=workload.sample_lengths(NUM_LENGTH_SAMPLES),
            micro_batch_per_gpu=spec.algorithm.micro_batch_per_gpu,
            step_cost=StepCost.of(spec, cost),
        )
        inventory = Inventory.of(spec)
        if len(inventory.groups) == 1:  # Alg. 1's splits keep the trainer's memory floor
            stages.min_trainer_gpus = min_trainer_gpus(cost, inventory.groups[0].hardware)
        return cls(spec, inventory, stages, cost, workload.longest_sequence_tokens)

    def throughput(self, s: Structure) -> float:
        """Estimated samples/s of a run of ``run.iterations`` optimizer steps."""
        iterations = self.spec.run.iterations
        first, steady = self.iteration_s(s)
        total = first + (iterations - 1) * steady
        return iterations * self.spec.algorithm.batch_size / total if total > 0 else 0.0

    def iteration_s(self, s: Structure) -> tuple[float, float]:
        """(first iteration, each later one): the first has nothing to overlap with."""
        traits = MODES.get(s.mode)
        if traits.colocated:
            g = self.inventory.groups[0]
            switch_s = self.cost.context_switch_s(
                g.num_gpus, s.tp, self.spec.cluster.network.pcie_gb_per_s
            )
            gen = self._drain_s(g.hardware, s.tp, s.max_num_seqs, g.num_gpus // s.tp)
            t = gen + self._train_s(g.hardware, g.num_gpus) + 2 * switch_s
            return t, t
        train = self._train_s(self.inventory.groups[s.trainer_group].hardware, s.trainer_gpus)
        gen = self.generation_s(s)
        if traits.continuous:  # the tail may span lag + 1 steps
            t = max(self.capacity_s(s), train, gen / ((s.lag or 0) + 1))
            return t, t
        if traits.conventional or not (traits.streaming or (traits.max_lag or 0) > 0):
            return gen + train, gen + train
        first = max(gen, train) if traits.streaming else gen + train
        return first, max(gen, train)

    def generation_s(self, s: Structure) -> float:
        """One batch over every generation pool, pools sharing it in proportion to speed."""
        rates = [
            1.0 / self._drain_s(g.hardware, s.tp, s.max_num_seqs, n // s.tp)
            for g, n in zip(self.inventory.groups, s.generation_gpus)
            if n >= s.tp
        ]
        return 1.0 / sum(rates) if rates else math.inf

    def _drain_s(self, hardware: str, tp: int, max_num_seqs: int, instances: int) -> float:
        key = (hardware, tp, max_num_seqs, instances)
        if key not in self._drains:
            lengths = self._batch_lengths()[::instances]  # the instance with the longest
            slots = min(max_num_seqs, self._kv_slots(Device(hardware, tp)))
            self._drains[key] = drain_s(
                self.cost, Device(hardware, tp), lengths, slots, self.stages.prompt_tokens
            )
        return self._drains[key]

    def _batch_lengths(self) -> np.ndarray:
        """One batch's output lengths, longest first (quantiles of the workload's)."""
        batch = self.spec.algorithm.batch_size
        qs = (np.arange(batch) + 0.5) / batch
        lengths = np.quantile(np.asarray(self.stages.output_tokens, float), qs)
        return np.sort(np.maximum(1, np.round(lengths)).astype(int))[::-1]

    def _kv_slots(self, device: Device) -> int:
        per_seq = self.stages.prompt_tokens + float(np.mean(self.stages.output_tokens))
        return max(1, int(self.cost.kv_capacity_tokens(device) // per_seq))

    def capacity_s(self, s: Structure) -> float:
        """The batch's output tokens at the decode rate with every instance's slots busy."""
        lengths = np.asarray(self.stages.output_tokens, float)
        tokens = self.spec.algorithm.batch_size * float(lengths.mean())
        rate = 0.0
        for g, n in zip(self.inventory.groups, s.generation_gpus):
            instances = n // s.tp
            if instances:
                rate += instances * self._instance_rate(g.hardware, s, instances)
        return tokens / rate if rate > 0 else math.inf

    def _instance_rate(self, hardware: str, s: Structure, instances: int) -> float:
        """Tokens/s of one instance running its share of ``lag + 1`` batches at once."""
        in_flight = self.spec.algorithm.batch_size * ((s.lag or 0) + 1)
        slots = min(s.max_num_seqs, self._kv_slots(Device(hardware, s.tp)))
        running = max(1, min(slots, math.ceil(in_flight / instances)))
        mean_len = float(np.mean(self.stages.output_tokens))
        context = int(running * (self.stages.prompt_tokens + mean_len / 2))
        return running / self.cost.decode_step_s(Device(hardware, s.tp), running, context)

    def _train_s(self, hardware: str, num_gpus: int) -> float:
        """One step on the trainer: forward, backward, exposed all-reduce and optimizer."""
        if num_gpus <= 0:
            return math.inf
        return self.stages.training_s(hardware, num_gpus)

    def cost_units(self, s: Structure) -> float | None:
        """GPU cost in H20-machine units (``policies.results.COST_UNIT``; the sim's
        ``cost_normalized_throughput`` denominator)."""
        table = hardware_of(self.spec)
        total = 0.0
        counts = list(s.generation_gpus)
        if not s.colocated:
            counts[s.trainer_group] += s.trainer_gpus
        for g, n in zip(self.inventory.groups, counts):
            hw = table.get(g.hardware)
            if hw is None or hw.cost_per_gpu_rel_h20 is None:
                return None
            total += n * hw.cost_per_gpu_rel_h20
        return total
