"""PipelineRL's analytical throughput model (arXiv 2509.19128), on our cost model.

* Conventional RL generates B·G samples, then trains them: ``1/r = 1/r_gen + 1/r_train``.
  Generation keeps every instance full (H sequences, refilled as they finish) until the
  last H·I samples, which drain: that part sums per-step decode costs as the batch
  shrinks (:meth:`policies.stage_model.StageModel.generation_s`). Training prices the
  batch's tokens plus G optimizer steps, each with its exposed gradient all-reduce
  (``sim.step_cost``, as the simulated trainer pays them).
* PipelineRL: ``r = min(r_gen, r_train)`` with ``r_gen = U(H)·I`` for I generation GPUs at
  H concurrent sequences each and ``r_train = (N − I)/τ`` (τ: GPU-seconds to train one
  sample). ``U(H) = H / (PTL(H) · L̄)``: every running slot finishes a sample every L̄
  decode steps; the KV context per slot is the length-biased mean prompt + E[L²]/(2·E[L]).
* Max lag ≈ ceil(H·I·L / (L̄·B)) with L the max output length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from policies.protocols import Device
from policies.rng import RngStreams
from policies.spec import RunSpec
from policies.stage_model import StageModel


@dataclass(frozen=True, slots=True)
class AnalyticPoint:
    pipeline_samples_per_s: float
    conventional_samples_per_s: float
    r_gen: float  # PipelineRL generation rate, samples/s
    r_train: float  # PipelineRL training rate, samples/s
    max_lag_estimate: int


def analytic(spec: RunSpec, num_opt_steps: int) -> AnalyticPoint:
    """The model for ``spec``'s cluster; conventional takes ``num_opt_steps`` (G) per round."""
    from sim.costs import build_cost_model
    from sim.step_cost import StepCost
    from sim.workload import Workload

    cost = build_cost_model(spec)
    workload = Workload(spec, RngStreams(spec.run.seed))
    lengths = workload.sample_lengths(20000).astype(float)
    prompt = workload.mean_prompt_tokens
    pool, trainer = spec.cluster.generation[0], spec.cluster.trainer
    mean_len = float(lengths.mean())
    per_slot_ctx = prompt + float((lengths**2).mean() / (2 * mean_len))
    device = Device(pool.hardware, pool.tp)
    h = pool.max_num_seqs
    ptl = cost.decode_step_s(device, h, int(h * per_slot_ctx))
    r_gen = pool.num_instances * h / (ptl * mean_len)
    tau = cost.train_s(Device(trainer.hardware, 1), int(prompt + mean_len))
    r_train = trainer.num_gpus / tau
    batch = spec.algorithm.batch_size * num_opt_steps
    slots = h * pool.num_instances
    drain = StageModel(cost, min(batch, slots), prompt, list(lengths.astype(int)))
    full_s = max(0, batch - slots) / r_gen  # instances full until the last H·I samples
    stages = StageModel(cost, batch, prompt, list(lengths.astype(int)))
    per_step = StepCost.of(spec, cost).step_s(
        Device(trainer.hardware, trainer.num_gpus),
        spec.algorithm.batch_size,
        stages.batch_tokens / num_opt_steps,
    )  # each of the G steps: exposed gradient all-reduce and optimizer, as the sim's trainer
    t_round = (
        full_s
        + drain.generation_s(pool)
        + stages.forward_backward_s(trainer.hardware, trainer.num_gpus)
        + num_opt_steps * per_step
    )
    lag = math.ceil(
        h * pool.num_instances * spec.workload.max_output_tokens
        / (mean_len * spec.algorithm.batch_size)
    )  # fmt: skip
    return AnalyticPoint(min(r_gen, r_train), batch / t_round, r_gen, r_train, lag)


def steady_throughput(step_end_s: list[float], batch_size: int) -> float:
    """Samples/s over the middle half of the optimizer steps (no fill, no drain)."""
    n = len(step_end_s)
    if n < 4:
        return batch_size * n / step_end_s[-1] if n else 0.0
    lo, hi = n // 4, n - 1 - n // 4
    return batch_size * (hi - lo) / (step_end_s[hi] - step_end_s[lo])
