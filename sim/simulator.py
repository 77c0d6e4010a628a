"""The simulator: wires engines, trainer and network to a pipeline-mode controller.

The controller (``policies.modes``) decides; this module only executes its commands in
simulated time and feeds back events, exactly as the live runtime does with real
servers. Modelling assumptions of each part are in the docstrings of ``sim.engine``,
``sim.trainer``, ``sim.costs``, ``sim.pushes`` and ``sim.workload``; pushes over one
cross-datacenter link queue (``sim.links``), and a colocated context switch stalls every GPU.
A length ranker's history (``policies.protocols.HistoryLengthPredictor``) gets each sample
as it finishes, before the controller hears of it: a request is ranked on the samples
finished when it is dispatched. Known bias: a live actor hands lengths over in batches
(``length_update_every``, 32), so a live ranker's history lags the sim's by up to 31
samples.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import simpy

from policies.build import (
    ExecutorInputs,
    build_allocation,
    build_policies,
    instance_views,
    mode_of,
)
from policies.cluster import GenerationPool
from policies.data_parallel import busy_trainer_gpus, micro_batches_per_gpu
from policies.modes.events import (
    Command,
    ContextSwitched,
    Dispatch,
    Event,
    Finish,
    OptimizerStep,
    Phase,
    PushWeights,
    RequestsAborted,
    SampleFinished,
    ScaleIn,
    ScaleOut,
    Start,
    SwitchContext,
    TrainSamples,
    TrainStepDone,
    WeightsLoaded,
)
from policies.protocols import Device, HistoryLengthPredictor, LengthPredictor
from policies.records import (
    Completion,
    Request,
    SampleRecord,
    Span,
    SpanKind,
    StepStats,
)
from policies.resources import TRAINER
from policies.results import RunResult, compute_metrics, discard_metrics, split_metrics
from policies.rng import RngStreams
from policies.spec import RunSpec
from policies.tracking import StepUpdate
from sim import scaling
from sim.cluster import kv_too_small, resolve_cluster
from sim.costs import build_cost_model
from sim.engine import EngineConfig, EngineHooks, GenerationEngine, StepCosts
from sim.gpu_cost import GpuLease, gpu_prices, mean_cost_units, mean_gpus
from sim.links import Links, cut_at
from sim.models import resolved_model
from sim.pushes import WeightPushes
from sim.run_loop import few_collections, run_until_done, stall_report
from sim.scheduler import SequenceTooLong
from sim.sequence import engine_limits
from sim.step_cost import StepCost
from sim.tables import hardware_of
from sim.ticks import DecodeLaw, to_seconds, to_ticks
from sim.trainer import SimTrainer
from sim.workload import Workload

NUM_CALIBRATION_SAMPLES = 20000

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Instance:
    engine: GenerationEngine
    pool: GenerationPool
    held_from_s: float  # its GPUs taken: the run's start, or its ScaleOut (sim.gpu_cost)
    retiring: bool = False  # asked to retire (ScaleIn): finishing what it runs
    retired_s: float | None = None  # retired: takes no weight pushes

    @property
    def lease(self) -> GpuLease:
        """Its GPUs, from when they were taken to its retirement (or the run's end)."""
        return GpuLease(self.pool.hardware, self.pool.tp, self.held_from_s, self.retired_s)


class Simulation:
    """``Simulation(spec).run()`` returns a :class:`RunResult`; construction does nothing."""

    def __init__(
        self,
        spec: RunSpec,
        fast_forward: bool | None = None,
        ranker: LengthPredictor | None = None,
    ) -> None:
        self.spec = spec
        self.fast_forward = spec.sim.fast_forward if fast_forward is None else fast_forward
        self.ranker = ranker  # for ``length_predictor: ranker``, fitted by the caller

    def run(self, on_step: Callable[[StepUpdate], None] | None = None) -> RunResult:
        """Simulate the spec; ``on_step`` gets a :class:`StepUpdate` after every optimizer
        step (in simulated time), e.g. a progress bar or an ``experiments.tracking`` logger."""
        wall0 = time.perf_counter()
        with few_collections():
            world = _World(self.spec, self.fast_forward, on_step, self.ranker)
            log.info(
                "simulating %s: %s, %d instances, %d iterations of %d samples",
                self.spec.run.name, self.spec.pipeline.mode, len(world.instances),
                self.spec.run.iterations, self.spec.algorithm.batch_size,
            )  # fmt: skip
            world.env.process(world.trainer.run())
            world.emit(Start(0.0))
            run_until_done(world.env, world.done, world.stall_report)
            result = world.result(time.perf_counter() - wall0)
        metrics = result.metrics
        log.info("simulated %.1f s in %.2f s", metrics["makespan_s"], metrics["sim_wall_s"])
        return result


class _World:
    def __init__(
        self,
        spec: RunSpec,
        fast_forward: bool,
        on_step: Callable[[StepUpdate], None] | None,
        ranker: LengthPredictor | None = None,
    ):
        self._ranker = ranker
        # a ranker's history: each sample from when it finished (what a live run knows)
        self._history = ranker if isinstance(ranker, HistoryLengthPredictor) else None
        self.env = simpy.Environment()
        self.done = self.env.event()
        self.rngs = RngStreams(spec.run.seed)
        self.cost = build_cost_model(spec)
        self.workload = Workload(spec, self.rngs)
        allocation = build_allocation(spec)
        self.mode = mode_of(spec)
        self.cluster = resolve_cluster(spec, self.mode, self.cost, self.workload, allocation)
        model = resolved_model(spec.model)
        self.spec = spec.model_copy(update={"cluster": self.cluster, "model": model})
        self.colocated = self.mode.colocated
        self._fast_forward = fast_forward
        self._on_step = on_step
        self._trained: dict[int, list[Completion]] = {}  # step -> its samples (for on_step)
        self._spans_reported = 0  # spans already handed to on_step
        views = instance_views(self.spec, self.cost.kv_capacity_tokens)
        self.policies = build_policies(self.spec, self._executor_inputs(), views, allocation)
        self.controller = self.policies.controller
        self.instances: dict[int, _Instance] = {}
        self.completions: dict[int, Completion] = {}
        self.spans: list[Span] = []
        links = Links(self.env, self.spans.append)
        self.pushes = WeightPushes(
            self.cost, spec.cluster.network, self.cluster.trainer.datacenter, links
        )
        self.steps: list[StepStats] = []
        self.trainer = self._make_trainer()  # before the instances: they ask if it is busy
        for pool in self.cluster.generation:
            for _ in range(pool.num_instances):
                self._add_instance(pool, version=0)
        self._handlers: dict[type, Callable] = {
            Dispatch: self._dispatch,
            TrainSamples: self._train_samples,
            OptimizerStep: self.trainer.submit,
            PushWeights: self._push_weights,
            SwitchContext: self._switch_context,
            ScaleOut: self._scale_out,
            ScaleIn: lambda c: scaling.retire(self, c.instance_ids),
            Finish: lambda _: self.done.succeed(),
        }

    # -- construction -------------------------------------------------------------------

    def _add_instance(
        self, pool: GenerationPool, version: int, held_from_s: float | None = None
    ) -> _Instance:
        instance_id = len(self.instances)
        device = Device(pool.hardware, pool.tp)
        hooks = EngineHooks(
            finished=lambda c: self.emit(SampleFinished(to_seconds(self.env.now), c)),
            weights_loaded=lambda i, v: self.emit(WeightsLoaded(to_seconds(self.env.now), i, v)),
            aborted=self._aborted,
            span=self.spans.append,
            busy=lambda i, working: working or scaling.retire_if_drained(self, i),
        )
        costs = StepCosts(
            law=lambda n, d=device: self.cost.decode_law(d, n),
            mixed=lambda work, d=device: to_ticks(self.cost.mixed_step_s(d, work)),
            contended_law=self._contended_law(device),
        )
        limits = engine_limits(pool, self.cost.kv_capacity_tokens(device))
        engine = GenerationEngine(
            self.env,
            EngineConfig(instance_id, limits, self._fast_forward),
            costs,
            scheduling=self.policies.scheduling,
            truth=self.workload.true_output_tokens,
            hooks=hooks,
            version=version,
        )
        engine.set_contended(self.trainer.busy)
        held_s = to_seconds(self.env.now) if held_from_s is None else held_from_s
        inst = self.instances[instance_id] = _Instance(engine, pool, held_s)
        self.env.process(engine.run())
        return inst

    def _contended_law(self, device: Device) -> Callable[[int], DecodeLaw] | None:
        if self.cost.contended_decode_law(device, 1) is None:
            return None
        return lambda n: self.cost.contended_decode_law(device, n)  # type: ignore[return-value]

    def _contended_train_ticks(self, device: Device) -> Callable[[int, int], int] | None:
        if self.cost.contended_train_s(device, 1) is None:
            return None
        calls = self._micro_batches(device)
        return lambda samples, tokens: to_ticks(
            self.cost.contended_train_s(device, tokens, calls(samples)) or 0.0
        )

    def _micro_batches(self, device: Device) -> Callable[[int], int]:
        """A job's micro-batches on the busiest of ``device``'s (busy) GPUs."""
        per_gpu = self.spec.algorithm.micro_batch_per_gpu
        return lambda samples: micro_batches_per_gpu(device.num_gpus, samples, per_gpu)

    def _trainer_busy(self, busy: bool) -> None:
        for inst in self.instances.values():
            inst.engine.set_contended(busy)

    def _train_device(self) -> Device:
        """The trainer GPUs a step's batch keeps busy (``busy_trainer_gpus``: at most one
        per micro-batch); every job of the step is priced on them."""
        t, algorithm = self.cluster.trainer, self.spec.algorithm
        busy = busy_trainer_gpus(t.num_gpus, algorithm.batch_size, algorithm.micro_batch_per_gpu)
        return Device(t.hardware, busy)

    def _make_trainer(self) -> SimTrainer:
        t = self.cluster.trainer
        device, busy = Device(t.hardware, t.num_gpus), self._train_device()
        step, calls = StepCost.of(self.spec, self.cost), self._micro_batches(busy)
        return SimTrainer(
            self.env,
            train_ticks=lambda samples, tokens: to_ticks(
                self.cost.train_s(busy, tokens, calls(samples))
            ),
            contended_train_ticks=self._contended_train_ticks(busy),
            generation_busy=lambda: any(i.engine.num_running for i in self.instances.values()),
            optimizer_ticks=to_ticks(step.optimizer_s(device)),
            grad_sync_ticks=lambda samples, tokens: to_ticks(
                step.grad_sync_s(device, samples, tokens)
            ),  # every trainer GPU, behind one GPU's backward of the mean micro-batch
            on_step_done=self._step_done,
            on_span=self.spans.append,
            on_busy=self._trainer_busy,
        )

    def _executor_inputs(self) -> ExecutorInputs:
        """What only the simulator knows, for the builder."""
        return ExecutorInputs(
            cost_model=self.cost,
            prompts=self.workload,
            rngs=self.rngs,
            micro_batch_samples=self.cluster.trainer.num_gpus
            * self.spec.algorithm.micro_batch_per_gpu,
            truth=self.workload.true_output_tokens,
            calibration_lengths=list(self.workload.sample_lengths(NUM_CALIBRATION_SAMPLES)),
            ranker=self._ranker,  # for ``length_predictor: ranker``, fitted by the caller
            can_scale_out=True,
        )

    # -- events in, commands out ----------------------------------------------------------

    def emit(self, event: Event) -> None:
        if isinstance(event, SampleFinished):
            c = self.completions[event.completion.sample_id] = event.completion
            if self._history is not None:  # before the controller dispatches on it
                self._history.record([c.request], [c.output_tokens])
        for command in self.controller.handle(event):
            self._execute(command)

    def _execute(self, command: Command) -> None:
        self._handlers[type(command)](command)

    def _dispatch(self, command: Dispatch) -> None:
        instance = self.instances[command.instance_id]
        try:
            instance.engine.submit(command.requests)
        except SequenceTooLong as err:
            raise ValueError(kv_too_small(self.spec, instance.pool, err)) from None

    def _aborted(self, instance_id: int, requests: list[Request]) -> None:
        self.emit(RequestsAborted(to_seconds(self.env.now), instance_id, tuple(requests)))

    def _train_samples(self, command: TrainSamples) -> None:
        if self._on_step is not None:
            self._trained.setdefault(command.step, []).extend(command.completions)
        self.trainer.submit(command)

    def _step_done(self, stats: StepStats) -> None:
        self.steps.append(stats)
        if self._on_step is not None:
            self._on_step(self._step_update(stats))
        self.emit(TrainStepDone(to_seconds(self.env.now), stats))

    def _step_update(self, stats: StepStats) -> StepUpdate:
        done = self._trained.pop(stats.step, [])
        samples = tuple(SampleRecord.from_completion(c, train_step=stats.step) for c in done)
        spans, self._spans_reported = self.spans[self._spans_reported :], len(self.spans)
        return StepUpdate(stats, samples, tuple(spans), num_steps=self.spec.run.iterations)

    def _push_weights(self, command: PushWeights) -> None:
        self.pushes.push(list(self.instances.values()), command)

    def _switch_context(self, command: SwitchContext) -> None:
        self.env.process(self._switch_proc(command))

    def _switch_proc(self, command: SwitchContext):  # noqa: ANN202 - SimPy process
        start = to_seconds(self.env.now)
        pool = self.cluster.generation[0]
        switch_s = self.cost.context_switch_s(
            self.cluster.trainer.num_gpus, pool.tp, self.spec.cluster.network.pcie_gb_per_s
        )
        yield self.env.timeout(to_ticks(switch_s))
        for name in [TRAINER, *(i.engine.name for i in self.instances.values())]:
            self.spans.append(Span(name, SpanKind.CONTEXT_SWITCH, start, to_seconds(self.env.now)))
        if command.to == Phase.GENERATE:  # colocated weights are local: onloaded, not sent
            for inst in self.instances.values():
                inst.engine.version = len(self.steps)
        self.emit(ContextSwitched(to_seconds(self.env.now), command.to))

    def _scale_out(self, command: ScaleOut) -> None:
        pool, start_s = self.cluster.generation[0], self.spec.sim.instance_start_s
        version, kv = lambda: self.controller.latest_version, self.cost.kv_capacity_tokens
        asked_s = to_seconds(self.env.now)  # its GPUs are held (and paid for) from now
        add = partial(self._add_instance, held_from_s=asked_s)
        proc = scaling.scale_out(self, command.num_instances, start_s, pool, version, add, kv)
        self.env.process(proc)

    # -- result ---------------------------------------------------------------------------

    def stall_report(self) -> str:
        return stall_report(self, self.spec.run.iterations, self.spec.algorithm.batch_size)

    def result(self, wall_s: float) -> RunResult:
        end_s = to_seconds(self.env.now)
        samples = [
            self._record(c) for c in sorted(self.completions.values(), key=lambda c: c.sample_id)
        ]
        gen = {i.engine.name: i.lease.held_s(end_s) for i in self.instances.values()}
        held = [i.lease for i in self.instances.values()]  # generation GPUs while held
        if not self.colocated:  # colocated: every GPU once, as the instances'
            held.append(GpuLease(self.cluster.trainer.hardware, self.cluster.trainer.num_gpus))
        cost_units = mean_cost_units(held, end_s, gpu_prices(hardware_of(self.spec)))
        spans = cut_at(self.spans, end_s)  # a push still crossing a link at the end
        metrics = compute_metrics(
            samples, spans, end_s, gen, self.colocated, self.spec.run.iterations, cost_units
        )
        metrics["sim_wall_s"] = wall_s
        metrics.update(split_metrics(self.cluster))  # the split that ran (balanced: its own)
        metrics["mean_generation_gpus"] = mean_gpus(held[: len(self.instances)], end_s)
        metrics.update(discard_metrics([i.engine.discarded for i in self.instances.values()]))
        return RunResult(self.spec, metrics, samples, spans, self._step_rows())

    def _step_rows(self) -> list[dict[str, Any]]:
        return [
            {
                "step": s.step,
                "start_s": s.start_s,
                "end_s": s.end_s,
                "num_samples": s.num_samples,
                "num_tokens": s.num_tokens,
                "busy_s": s.busy_s,
                "optimizer_s": self.trainer.optimizer_s.get(s.step),
                "grad_sync_s": self.trainer.grad_sync_s.get(s.step),
            }
            for s in self.steps
        ]

    def _record(self, c: Completion) -> SampleRecord:
        return SampleRecord.from_completion(
            c, train_step=self.controller.train_step_of.get(c.sample_id)
        )
