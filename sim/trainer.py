"""The trainer as a SimPy process: a FIFO of forward/backward jobs and optimizer steps.

Modelling assumptions: data parallel over the trainer's GPUs with token-balanced
micro-batches of ``algorithm.micro_batch_per_gpu`` samples (time = tokens × FLOPs per
token / (busy GPUs × peak × MFU)). A step's batch of ``B`` samples keeps
``min(GPUs, ceil(B / micro_batch_per_gpu))`` GPUs busy
(:func:`policies.data_parallel.busy_trainer_gpus`): a sample is never split, so GPUs past
one per micro-batch add nothing; every job of the step is priced on those. The optimizer
step is memory-bound, its states sharded over every GPU, and is its own job (its time per
step: ``SimTrainer.optimizer_s``); jobs run in the order the controller issued them, so a
stream mode's micro-batches for step s+1 wait behind step s's optimizer step.

The gradient all-reduce runs once per optimizer step, over every trainer GPU (idle ones
hold gradients too), as data parallelism with gradient accumulation does (DDP's
``no_sync`` on all but the last micro-batch; Megatron-LM likewise): a step's jobs are
micro-batches accumulated into one gradient, and the controller issues the step's
optimizer job right after its last one. Its buckets hide behind the backward of that last
micro-batch; what does not (``sim.comm.exposed_grad_allreduce_s``, through the cost
model's ``grad_sync_s``) opens the optimizer job, reported per step as ``grad_sync_s``
(``SimTrainer.grad_sync_s``). The last micro-batch is taken as the step's mean one:
``micro_batch_per_gpu`` samples of the step's mean tokens per sample.

A job of ``n`` samples runs ``ceil(ceil(n / micro_batch_per_gpu) / busy GPUs)``
micro-batches on the busiest GPU (:func:`policies.data_parallel.micro_batches_per_gpu`),
which the cost model is told: a calibrated model pays its profiled per-call fixed cost once
per micro-batch (the roofline model, linear in tokens, does not use it).

Known biases: work is balanced by tokens over the busy GPUs, so a stream mode's last,
smaller micro-batch of a step is priced as if it kept them all busy.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass

import simpy

from policies.modes.events import OptimizerStep, TrainSamples
from policies.records import Span, SpanKind, StepStats
from policies.resources import TRAINER
from sim.ticks import to_seconds

Proc = Generator[simpy.Event, object, None]


@dataclass(slots=True)
class _StepProgress:
    start_ticks: int | None = None
    busy_ticks: int = 0
    optimizer_ticks: int = 0
    grad_sync_ticks: int = 0
    num_samples: int = 0
    num_tokens: int = 0


class SimTrainer:
    def __init__(
        self,
        env: simpy.Environment,
        train_ticks: Callable[[int, int], int],  # (a job's samples, its tokens) -> ticks
        optimizer_ticks: int,
        on_step_done: Callable[[StepStats], None],
        on_span: Callable[[Span], None],
        on_busy: Callable[[bool], None] | None = None,
        contended_train_ticks: Callable[[int, int], int] | None = None,
        generation_busy: Callable[[], bool] = lambda: False,
        grad_sync_ticks: Callable[[int, int], int] = lambda num_samples, num_tokens: 0,
    ) -> None:
        self.env = env
        self._contended_train_ticks = contended_train_ticks  # while generation decodes
        self._generation_busy = generation_busy
        self._on_busy = on_busy
        self.busy = False
        self._train_ticks = train_ticks
        self._optimizer_ticks = optimizer_ticks
        self._grad_sync_ticks = grad_sync_ticks  # (a step's samples, its tokens) -> exposed
        self._on_step_done = on_step_done
        self._on_span = on_span
        self.jobs: simpy.Store = simpy.Store(env)
        self._progress: dict[int, _StepProgress] = {}
        self.optimizer_s: dict[int, float] = {}  # step -> its optimizer step's seconds
        self.grad_sync_s: dict[int, float] = {}  # step -> its exposed gradient all-reduce

    def submit(self, job: TrainSamples | OptimizerStep) -> None:
        self.jobs.put(job)

    def run(self) -> Proc:
        while True:
            if not self.jobs.items:
                self._set_busy(False)
            job = yield self.jobs.get()
            self._set_busy(True)
            progress = self._progress.setdefault(job.step, _StepProgress())
            start = self.env.now
            if progress.start_ticks is None:
                progress.start_ticks = start
            if isinstance(job, TrainSamples):
                yield from self._forward_backward(job, progress)
            else:
                yield from self._sync_and_step(progress)
            self._on_span(
                Span(
                    TRAINER,
                    SpanKind.TRAIN,
                    to_seconds(start),
                    to_seconds(self.env.now),
                    job.step,
                    getattr(job, "completions", None) and len(job.completions),
                )
            )
            if isinstance(job, OptimizerStep):
                done = self._progress.pop(job.step)
                self.optimizer_s[job.step] = to_seconds(done.optimizer_ticks)
                self.grad_sync_s[job.step] = to_seconds(done.grad_sync_ticks)
                self._on_step_done(self._stats(job.step, done))

    def _set_busy(self, busy: bool) -> None:
        if busy != self.busy:
            self.busy = busy
            if self._on_busy is not None:
                self._on_busy(busy)

    def _sync_and_step(self, progress: _StepProgress) -> Proc:
        """The gradient all-reduce's exposed part, then the optimizer step."""
        sync = self._grad_sync_ticks(progress.num_samples, progress.num_tokens)
        yield self.env.timeout(sync + self._optimizer_ticks)
        progress.busy_ticks += sync + self._optimizer_ticks
        progress.grad_sync_ticks += sync
        progress.optimizer_ticks += self._optimizer_ticks

    def _forward_backward(self, job: TrainSamples, progress: _StepProgress) -> Proc:
        tokens = sum(c.request.prompt_tokens + c.output_tokens for c in job.completions)
        start = self.env.now
        ticks = self._train_ticks
        if self._contended_train_ticks is not None and self._generation_busy():
            ticks = self._contended_train_ticks
        yield self.env.timeout(ticks(len(job.completions), tokens))
        progress.busy_ticks += self.env.now - start
        progress.num_samples += len(job.completions)
        progress.num_tokens += tokens

    def _stats(self, step: int, progress: _StepProgress) -> StepStats:
        assert progress.start_ticks is not None
        return StepStats(
            step=step,
            version=step + 1,
            num_samples=progress.num_samples,
            num_tokens=progress.num_tokens,
            start_s=to_seconds(progress.start_ticks),
            end_s=to_seconds(self.env.now),
            busy_s=to_seconds(progress.busy_ticks),
        )
