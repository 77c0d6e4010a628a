"""A generation instance: one vLLM engine (V1 scheduler, paged KV cache) as a SimPy process.

The scheduling rules are vLLM's own, step for step, in :mod:`sim.scheduler` (token budget
with chunked prefill, decode before prefill, block-granular KV with prefix caching,
admission only when the whole sequence fits, preemption by recompute); this module gives
each step its time and talks to the rest of the simulation.

Modelling assumptions and known biases:

* A step's time is the cost model's: a decode-only step of ``n`` sequences is the decode
  law at their context; a step with prefill tokens is the cost model's mixed step (decode
  and prefill tokens in one forward pass). The first output token comes with the prefill.
* A request's prompt shares KV with other requests of the same prompt and weight version
  on the same instance (GRPO siblings), as the live servers' version salts make it;
  nothing is shared across an update (:mod:`sim.kv_cache`).
* Requests arriving during a step join at the next step boundary; an in-flight update
  pauses at the next step boundary.

Exact fast-forward: while every running sequence decodes one token a step and nothing
can be admitted, steps are identical but for their context, so the engine sleeps straight
to the next completion (or the step that runs out of KV blocks) with the summed step times
from the decode law's closed form (:class:`sim.ticks.DecodeLaw`). An arrival, an in-flight
weight update or a change of contention wakes it; it then finishes the step in progress
and continues from that boundary. Time is integer ticks, so fast-forward and stepping one
step at a time give identical times.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass

import simpy

from policies.records import (
    Completion,
    Discarded,
    FinishReason,
    InflightHandling,
    Request,
    Span,
    SpanKind,
)
from policies.scheduling import SchedulingPolicy
from sim.scheduler import Scheduler, StepPlan
from sim.sequence import EngineLimits, Seq
from sim.ticks import DecodeLaw, StepWork, to_seconds

Proc = Generator[simpy.Event, object, None]


@dataclass(slots=True)
class PendingUpdate:
    version: int
    inflight: InflightHandling
    pause_ticks: int  # pause seen by generation: receive (in flight) + load
    arrived: bool


@dataclass(slots=True)
class EngineHooks:
    finished: Callable[[Completion], None]
    weights_loaded: Callable[[int, int], None]  # instance id, version
    aborted: Callable[[int, list[Request]], None]
    span: Callable[[Span], None]
    busy: Callable[[int, bool], None] | None = None  # instance id, has work now (on changes)


@dataclass(slots=True, frozen=True)
class EngineConfig:
    instance_id: int
    limits: EngineLimits
    fast_forward: bool = True


@dataclass(slots=True)
class StepCosts:
    """Step times in ticks: ``law(n)`` for decode-only steps of ``n`` sequences, ``mixed``
    for steps with prefill tokens; the contended law while the trainer computes on the
    same host (None: never contended)."""

    law: Callable[[int], DecodeLaw]
    mixed: Callable[[StepWork], int]
    contended_law: Callable[[int], DecodeLaw] | None = None


class GenerationEngine:
    def __init__(
        self,
        env: simpy.Environment,
        config: EngineConfig,
        costs: StepCosts,
        scheduling: SchedulingPolicy,
        truth: Callable[[Request], int],
        hooks: EngineHooks,
        version: int = 0,
    ) -> None:
        self.env = env
        self.config = config
        self.costs = costs
        self.contended = False
        self._scheduling = scheduling
        self._truth = truth
        self._hooks = hooks
        self.version = version
        self.scheduler = Scheduler(config.limits)
        self._wake: simpy.Event | None = None
        self._update: PendingUpdate | None = None
        self.working = False  # has requests to run (reported through hooks.busy)
        self.discarded = Discarded()  # what abort-resubmit updates threw away
        self.name = f"gen-{config.instance_id}"

    # -- inputs -----------------------------------------------------------------------

    def set_contended(self, contended: bool) -> None:
        """The trainer started or stopped computing: decode from the next step at that rate."""
        if self.costs.contended_law is None or contended == self.contended:
            return
        self.contended = contended
        if self.scheduler.num_running:
            self._notify()  # end the current decode run at its next step boundary

    def submit(self, requests: list[Request] | tuple[Request, ...]) -> None:
        for r in requests:
            true_tokens = self._truth(r)
            target = max(1, min(true_tokens, r.max_tokens))
            reason = FinishReason.LENGTH if true_tokens >= r.max_tokens else FinishReason.STOP
            priority = self._scheduling.priority(r)
            self.scheduler.add(r, target, reason, priority, self.version, self.env.now)
        self._notify()

    def push_weights(
        self, version: int, inflight: InflightHandling, pause_ticks: int, transfer_ticks: int
    ) -> None:
        """New weights: in flight they are received while paused; else in the background.

        A push replaces an update still pending, which can change admission (a pending
        ``drain`` holds the queue, a ``barrier`` in transit does not), so the engine always
        re-plans at its next step boundary, as it would stepping one token at a time.
        """
        if inflight == InflightHandling.BARRIER:
            self._update = PendingUpdate(version, inflight, pause_ticks, arrived=False)
            self.env.process(self._arrive(version, transfer_ticks))
        else:
            self._update = PendingUpdate(version, inflight, pause_ticks, arrived=True)
        self._notify()

    def _arrive(self, version: int, transfer_ticks: int) -> Proc:
        yield self.env.timeout(transfer_ticks)
        if self._update is not None and self._update.version == version:
            self._update.arrived = True
            self._notify()

    def _notify(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    # -- main loop --------------------------------------------------------------------

    def run(self) -> Proc:
        while True:
            if self._update is not None and self._update_due():
                yield from self._apply_update()
                continue
            admit = self._admitting()
            run_steps = self.scheduler.decode_run(admit)
            working = bool(run_steps or self.scheduler.num_running)
            working = working or bool(admit and self.scheduler.num_waiting)
            self._report_busy(working)
            if run_steps:
                yield from self._decode_run(run_steps)
            elif working:
                yield from self._step(admit)
            else:
                yield from self._idle()

    def _report_busy(self, working: bool) -> None:
        if working != self.working:
            self.working = working
            if self._hooks.busy is not None:
                self._hooks.busy(self.config.instance_id, working)

    def _admitting(self) -> bool:
        return self._update is None or self._update.inflight != InflightHandling.DRAIN

    def _update_due(self) -> bool:
        u = self._update
        assert u is not None
        if not u.arrived:
            return False
        if u.inflight in (InflightHandling.BARRIER, InflightHandling.DRAIN):
            busy = self.scheduler.num_running
            return not busy and (
                u.inflight == InflightHandling.DRAIN or not self.scheduler.num_waiting
            )
        return True

    def _apply_update(self) -> Proc:
        u = self._update
        assert u is not None
        self._update = None
        aborted = []
        if u.inflight == InflightHandling.ABORT_RESUBMIT:
            aborted = self._abort_running()
        start = self.env.now
        yield self.env.timeout(u.pause_ticks)
        self._span(SpanKind.WEIGHT_SYNC, start, None)
        self.version = u.version
        self._hooks.weights_loaded(self.config.instance_id, u.version)
        if aborted:
            self._hooks.aborted(self.config.instance_id, aborted)

    def _abort_running(self) -> list[Request]:
        """Abort every running request (to be dispatched again), counting what it discards."""
        seqs = self.scheduler.abort_running()
        self.discarded.add(len(seqs), sum(seq.num_output for seq in seqs))
        return [seq.request for seq in seqs]

    # -- steps ------------------------------------------------------------------------------

    def _step(self, admit: bool) -> Proc:
        """One scheduled step (a prefill chunk in it, a preemption, or a lone decode)."""
        plan = self.scheduler.schedule(admit)
        if plan.empty:  # it only preempted: nothing runs, the next step re-plans
            return
        for seq in plan.admitted:
            if seq.version_start is None:
                seq.version_start, seq.gen_start_ticks = self.version, self.env.now
        start = self.env.now
        yield self.env.timeout(self._step_ticks(plan))
        finished = self.scheduler.finish_step(plan)
        kind = SpanKind.PREFILL if plan.num_prefill_tokens else SpanKind.DECODE
        self._span(kind, start, plan.num_scheduled)
        self._report(finished)

    def _step_ticks(self, plan: StepPlan) -> int:
        law = self._law(plan.num_decode) if plan.num_decode else None
        if not plan.num_prefill_tokens:
            assert law is not None
            return law.step(plan.decode_context_tokens)
        work = StepWork(
            plan.num_decode, plan.decode_context_tokens, plan.num_prefill_tokens,
            plan.prefill_attention_pairs, plan.prefill_context_tokens,
        )  # fmt: skip
        ticks = self.costs.mixed(work)
        if self.contended and self.costs.contended_law is not None and plan.num_decode:
            idle = self.costs.law(plan.num_decode).step(plan.decode_context_tokens)
            busy = self.costs.contended_law(plan.num_decode).step(plan.decode_context_tokens)
            ticks = ticks * busy // max(1, idle)
        return ticks

    def _law(self, n: int) -> DecodeLaw:
        if self.contended and self.costs.contended_law is not None:
            return self.costs.contended_law(n)
        return self.costs.law(n)

    def _decode_run(self, run_steps: int) -> Proc:
        """Up to ``run_steps`` identical decode steps, in one sleep unless woken."""
        sched = self.scheduler
        n, ctx = len(sched.decoding), sched.decoding.context_tokens(sched.steps)
        law = self._law(n)
        steps = run_steps if self.config.fast_forward else 1
        start, total = self.env.now, law.span(ctx, steps)
        self._wake = self.env.event()
        yield self.env.timeout(total) | self._wake
        self._wake = None
        elapsed = self.env.now - start
        if elapsed < total:  # woken early: stop at the first step boundary from now
            steps = law.steps_within(ctx, elapsed, steps)
            if law.span(ctx, steps) < elapsed:
                steps += 1
                yield self.env.timeout(start + law.span(ctx, steps) - self.env.now)
        if steps == 0:
            return
        finished = sched.advance_decode(steps)
        self._span(SpanKind.DECODE, start, n)
        self._report(finished)

    def _idle(self) -> Proc:
        start = self.env.now
        self._wake = self.env.event()
        yield self._wake
        self._wake = None
        if self.env.now > start:
            self._span(SpanKind.IDLE, start, None)

    # -- records ------------------------------------------------------------------------

    def _report(self, finished: list[Seq]) -> None:
        for seq in finished:
            self._hooks.finished(self._completion(seq))

    def _completion(self, seq: Seq) -> Completion:
        assert seq.version_start is not None and seq.gen_start_ticks is not None
        return Completion(
            request=seq.request,
            instance_id=self.config.instance_id,
            output_tokens=seq.target_tokens,
            finish_reason=seq.finish_reason,
            version_start=seq.version_start,
            version_end=self.version,
            dispatch_s=to_seconds(seq.dispatch_ticks),
            gen_start_s=to_seconds(seq.gen_start_ticks),
            gen_end_s=to_seconds(self.env.now),
        )

    def _span(self, kind: SpanKind, start: int, batch_size: int | None) -> None:
        first = next(iter(self.scheduler.running), None)
        iteration = first.request.iteration if first is not None else None
        self._hooks.span(
            Span(
                self.name, kind, to_seconds(start), to_seconds(self.env.now), iteration, batch_size
            )
        )
