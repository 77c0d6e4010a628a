"""A generation instance: vLLM-like continuous batching as a SimPy process.

Modelling assumptions and known biases:

* Admission as vLLM's scheduler: up to ``max_num_seqs`` running sequences while the KV
  cache (in tokens, no block rounding) has room for the prompt; waiting requests are
  admitted in the scheduling policy's order; preempted ones go first.
* When a decode step would overflow the KV cache, the most recently admitted sequence is
  preempted by recompute: it frees its KV and later re-prefills prompt + generated tokens.
* Prefill of newly admitted requests is one step during which nothing decodes (vLLM V1
  mixes chunked prefill into decode steps; prompts here are short next to outputs).
* Every decode step emits one token per running sequence; a sequence of ``L`` output
  tokens takes ``L`` decode steps after its prefill.
* Requests arriving during a step join at the next step boundary (at or before a step's
  start time, they join that step).

Exact fast-forward: between two events the batch is constant, so the engine sleeps
straight to the next completion (or KV-full point) with the summed step times from the
cost model's closed form (:class:`sim.costs.DecodeLaw`). An arrival or an in-flight
weight update wakes it; it then finishes the step in progress and continues from that
boundary. Time is integer ticks, so fast-forward and step-by-step give identical times.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Generator
from dataclasses import dataclass

import simpy

from policies.records import (
    Completion,
    FinishReason,
    InflightHandling,
    Request,
    Span,
    SpanKind,
)
from policies.scheduling import SchedulingPolicy
from sim.costs import DecodeLaw, to_seconds

Proc = Generator[simpy.Event, object, None]


@dataclass(slots=True)
class Seq:
    request: Request
    target_tokens: int
    finish_reason: FinishReason
    dispatch_ticks: int
    done_tokens: int = 0  # generated so far (kept up to date only while not running)
    finish_step: int = 0  # engine step count at which it completes (while running)
    admit_order: int = 0
    version_start: int | None = None
    gen_start_ticks: int | None = None

    @property
    def kv_tokens(self) -> int:
        return self.request.prompt_tokens + self.done_tokens


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


@dataclass(slots=True, frozen=True)
class EngineConfig:
    instance_id: int
    max_num_seqs: int
    kv_capacity_tokens: int
    fast_forward: bool = True


class GenerationEngine:
    def __init__(
        self,
        env: simpy.Environment,
        config: EngineConfig,
        law: Callable[[int], DecodeLaw],
        prefill_ticks: Callable[[int], int],
        scheduling: SchedulingPolicy,
        truth: Callable[[Request], int],
        hooks: EngineHooks,
        version: int = 0,
        contended_law: Callable[[int], DecodeLaw] | None = None,
    ) -> None:
        self.env = env
        self.config = config
        self._law = law
        self._contended_law = contended_law  # while the trainer computes on the same host
        self.contended = False
        self._prefill_ticks = prefill_ticks
        self._scheduling = scheduling
        self._truth = truth
        self._hooks = hooks
        self.version = version
        self._waiting: list[tuple[int, float, int, Seq]] = []
        self._running: list[tuple[int, int, Seq]] = []
        self._order = itertools.count()
        self._step = 0  # decode steps taken so far
        self._ctx = 0  # KV tokens held by running sequences
        self._wake: simpy.Event | None = None
        self._update: PendingUpdate | None = None
        self.name = f"gen-{config.instance_id}"

    # -- inputs -----------------------------------------------------------------------

    def set_contended(self, contended: bool) -> None:
        """The trainer started or stopped computing: decode from the next step at that rate."""
        if self._contended_law is None or contended == self.contended:
            return
        self.contended = contended
        if self._running:
            self._notify()  # end the current decode run at its next step boundary

    def submit(self, requests: list[Request] | tuple[Request, ...]) -> None:
        for r in requests:
            true_tokens = self._truth(r)
            target = max(1, min(true_tokens, r.max_tokens))
            reason = FinishReason.LENGTH if true_tokens >= r.max_tokens else FinishReason.STOP
            self._enqueue(Seq(r, target, reason, dispatch_ticks=self.env.now), preempted=False)
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
        return len(self._running)

    # -- main loop --------------------------------------------------------------------

    def run(self) -> Proc:
        while True:
            if self._update is not None and self._update_due():
                yield from self._apply_update()
                continue
            admitted = self._admit()
            if admitted:
                yield from self._prefill(admitted)
            elif self._running:
                yield from self._decode()
            else:
                yield from self._idle()

    def _update_due(self) -> bool:
        u = self._update
        assert u is not None
        if not u.arrived:
            return False
        if u.inflight in (InflightHandling.BARRIER, InflightHandling.DRAIN):
            return not self._running and (u.inflight == InflightHandling.DRAIN or not self._waiting)
        return True

    def _apply_update(self) -> Proc:
        u = self._update
        assert u is not None
        self._update = None
        aborted = self._abort_running() if u.inflight == InflightHandling.ABORT_RESUBMIT else []
        start = self.env.now
        yield self.env.timeout(u.pause_ticks)
        self._span(SpanKind.WEIGHT_SYNC, start, None)
        self.version = u.version
        self._hooks.weights_loaded(self.config.instance_id, u.version)
        if aborted:
            self._hooks.aborted(self.config.instance_id, aborted)

    def _abort_running(self) -> list[Request]:
        requests = [seq.request for _, _, seq in sorted(self._running, key=lambda e: e[1])]
        self._running.clear()
        self._ctx = 0
        return requests

    # -- admission and prefill --------------------------------------------------------

    def _enqueue(self, seq: Seq, preempted: bool) -> None:
        key = (0 if preempted else 1, self._scheduling.priority(seq.request), next(self._order))
        heapq.heappush(self._waiting, (*key, seq))

    def _admit(self) -> list[Seq]:
        if self._update is not None and self._update.inflight == InflightHandling.DRAIN:
            return []
        admitted: list[Seq] = []
        while self._waiting and len(self._running) < self.config.max_num_seqs:
            seq = self._waiting[0][-1]
            # room for its KV and for one more token of every running sequence
            if self._ctx + seq.kv_tokens + len(self._running) + 1 > self.config.kv_capacity_tokens:
                break
            heapq.heappop(self._waiting)
            self._start(seq)
            admitted.append(seq)
        return admitted

    def _start(self, seq: Seq) -> None:
        seq.admit_order = next(self._order)
        seq.finish_step = self._step + seq.target_tokens - seq.done_tokens
        if seq.version_start is None:
            seq.version_start = self.version
            seq.gen_start_ticks = self.env.now
        self._ctx += seq.kv_tokens
        heapq.heappush(self._running, (seq.finish_step, seq.admit_order, seq))

    def _prefill(self, admitted: list[Seq]) -> Proc:
        start = self.env.now
        yield self.env.timeout(self._prefill_ticks(sum(s.kv_tokens for s in admitted)))
        self._span(SpanKind.PREFILL, start, len(admitted))

    # -- decode -------------------------------------------------------------------------

    def _decode(self) -> Proc:
        n = len(self._running)
        room = (self.config.kv_capacity_tokens - self._ctx) // n
        if room <= 0:
            self._preempt_newest()
            return
        law = self._contended_law(n) if self.contended and self._contended_law else self._law(n)
        steps = min(self._running[0][0] - self._step, room)
        if not self.config.fast_forward:
            steps = 1
        start, total = self.env.now, law.span(self._ctx, steps)
        self._wake = self.env.event()
        yield self.env.timeout(total) | self._wake
        self._wake = None
        elapsed = self.env.now - start
        if elapsed < total:  # woken early: stop at the first step boundary from now
            steps = law.steps_within(self._ctx, elapsed, steps)
            if law.span(self._ctx, steps) < elapsed:
                steps += 1
                yield self.env.timeout(start + law.span(self._ctx, steps) - self.env.now)
        self._advance(steps, start, n)

    def _advance(self, steps: int, start: int, n: int) -> None:
        if steps == 0:
            return
        self._span(SpanKind.DECODE, start, n)
        self._step += steps
        self._ctx += n * steps
        while self._running and self._running[0][0] <= self._step:
            _, _, seq = heapq.heappop(self._running)
            self._ctx -= seq.request.prompt_tokens + seq.target_tokens
            self._hooks.finished(self._completion(seq))

    def _preempt_newest(self) -> None:
        if len(self._running) == 1:
            raise ValueError(
                f"{self.name}: one sequence does not fit the KV cache "
                f"({self.config.kv_capacity_tokens} tokens)"
            )
        victim = max(self._running, key=lambda e: e[1])
        self._running.remove(victim)
        heapq.heapify(self._running)
        seq = victim[2]
        seq.done_tokens = seq.target_tokens - (seq.finish_step - self._step)
        self._ctx -= seq.request.prompt_tokens + seq.done_tokens
        self._enqueue(seq, preempted=True)

    def _idle(self) -> Proc:
        start = self.env.now
        self._wake = self.env.event()
        yield self._wake
        self._wake = None
        if self.env.now > start:
            self._span(SpanKind.IDLE, start, None)

    # -- records ------------------------------------------------------------------------

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
        iteration = self._running[0][2].request.iteration if self._running else None
        self._hooks.span(
            Span(
                self.name, kind, to_seconds(start), to_seconds(self.env.now), iteration, batch_size
            )
        )
