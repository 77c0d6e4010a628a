"""A GenerationEngine in a bare SimPy environment, with hooks that record what it reports."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import simpy

from policies.records import Completion, InflightHandling, Request, Span
from policies.scheduling import FcfsScheduling, SchedulingPolicy
from sim.engine import EngineConfig, EngineHooks, GenerationEngine, StepCosts
from sim.sequence import EngineLimits
from sim.ticks import DecodeLaw, StepWork


@dataclass
class Rig:
    """One engine; ``truth`` holds each sample's true output length."""

    env: simpy.Environment
    engine: GenerationEngine
    truth: dict[int, int]
    done: list[Completion] = field(default_factory=list)
    loads: list[tuple[int, int, int]] = field(default_factory=list)  # (tick, instance, version)
    aborts: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)  # (tick, sample ids)
    spans: list[Span] = field(default_factory=list)

    def submit_at(self, tick: int, requests: list[Request]) -> None:
        def proc():
            yield self.env.timeout(tick - self.env.now)
            self.engine.submit(requests)

        self.env.process(proc())

    def push_at(
        self,
        tick: int,
        version: int,
        inflight: InflightHandling,
        pause_ticks: int,
        transfer_ticks: int = 0,
    ) -> None:
        def proc():
            yield self.env.timeout(tick - self.env.now)
            self.engine.push_weights(version, inflight, pause_ticks, transfer_ticks)

        self.env.process(proc())

    def run(self, until: int | None = None) -> None:
        self.env.run(until=until)

    def ticks(self) -> dict[int, tuple[int, int]]:
        """sample id → (gen start, gen end) in ticks (exact: times are integer ticks)."""
        return {c.sample_id: (_tick(c.gen_start_s), _tick(c.gen_end_s)) for c in self.done}


def _tick(seconds: float | None) -> int:
    assert seconds is not None
    return round(seconds * 10**12)


def constant_law(step_ticks: int) -> Callable[[int], DecodeLaw]:
    return lambda n: DecodeLaw(n=n, p0=step_ticks, p1=0, q0=0, q1=0)


TEN_TICK_STEPS = constant_law(10)


def make_rig(
    truth: dict[int, int],
    law: Callable[[int], DecodeLaw] = TEN_TICK_STEPS,
    prefill: Callable[[int], int] = lambda tokens: 10,
    max_num_seqs: int = 256,
    kv_capacity_tokens: int = 10**9,
    scheduling: SchedulingPolicy | None = None,
    fast_forward: bool = True,
    resubmit_aborted: bool = False,
    block_size: int = 1,
    max_num_batched_tokens: int = 10**6,
    enable_prefix_caching: bool = True,
    scheduling_policy: str = "priority",
) -> Rig:
    """A step with prefill tokens costs ``prefill(prefill tokens)`` plus, if sequences
    decode in it too, their decode step; KV is ``kv_capacity_tokens // block_size`` blocks."""
    env = simpy.Environment()
    rig = Rig(env=env, engine=None, truth=truth)  # type: ignore[arg-type]

    def aborted(instance_id: int, requests: list[Request]) -> None:
        rig.aborts.append((env.now, tuple(r.sample_id for r in requests)))
        if resubmit_aborted:
            rig.engine.submit(requests)

    def mixed(work: StepWork) -> int:
        decode = law(work.num_decode).step(work.decode_context_tokens) if work.num_decode else 0
        return prefill(work.num_prefill_tokens) + decode

    hooks = EngineHooks(
        finished=rig.done.append,
        weights_loaded=lambda i, v: rig.loads.append((env.now, i, v)),
        aborted=aborted,
        span=rig.spans.append,
    )
    limits = EngineLimits(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(max_num_batched_tokens, max_num_seqs),
        block_size=block_size,
        num_blocks=kv_capacity_tokens // block_size,
        enable_prefix_caching=enable_prefix_caching,
        scheduling_policy=scheduling_policy,
    )
    rig.engine = GenerationEngine(
        env,
        EngineConfig(0, limits, fast_forward),
        StepCosts(law=law, mixed=mixed),
        scheduling=scheduling or FcfsScheduling(),
        truth=lambda r: truth[r.sample_id],
        hooks=hooks,
    )
    env.process(rig.engine.run())
    return rig
