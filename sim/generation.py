"""Generation only: requests already assigned to instances, all submitted at t = 0, no
trainer and no weight updates. The makespan of a dispatch decision, as the simulated
engines (:mod:`sim.engine`) run it: what a policy-effect experiment compares with live
servers running the same assignment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import simpy

from policies.protocols import Device
from policies.records import Completion, Request
from policies.scheduling import SchedulingPolicy
from sim.costs import SimCostModel
from sim.engine import EngineConfig, EngineHooks, GenerationEngine, StepCosts
from sim.sequence import EngineLimits
from sim.ticks import to_ticks


@dataclass(slots=True, frozen=True)
class GenerationResult:
    makespan_s: float  # from t = 0 to the last completion
    instance_end_s: dict[int, float]  # each instance's last completion
    completions: list[Completion]


def simulate_generation(
    assignment: Mapping[int, Sequence[Request]],
    limits: EngineLimits,
    cost: SimCostModel,
    device: Device,
    scheduling: SchedulingPolicy,
    truth: Callable[[Request], int],
    shared_host: bool = False,
) -> GenerationResult:
    """Run ``assignment`` (instance id -> its requests, in dispatch order) to the end.

    ``shared_host``: the instances are engines on one host (one core each, as the live
    CPU servers): while more than one has work, each decodes at the cost model's contended
    law (``decode_slowdown``, profiled with the host's other core busy); a cost model
    without one never contends."""
    env = simpy.Environment()
    done: list[Completion] = []
    contended = cost.contended_decode_law(device, 1) is not None
    costs = StepCosts(
        law=lambda n: cost.decode_law(device, n),
        mixed=lambda work: to_ticks(cost.mixed_step_s(device, work)),
        contended_law=(lambda n: cost.contended_decode_law(device, n)) if contended else None,
    )
    engines: dict[int, GenerationEngine] = {}

    def busy(instance_id: int, working: bool) -> None:
        many = sum(e.working for e in engines.values()) > 1
        for e in engines.values():
            e.set_contended(shared_host and many)

    hooks = EngineHooks(
        finished=done.append,
        weights_loaded=lambda i, v: None,
        aborted=lambda i, requests: None,
        span=lambda span: None,
        busy=busy,
    )
    for instance_id, requests in assignment.items():
        engine = engines[instance_id] = GenerationEngine(
            env, EngineConfig(instance_id, limits), costs, scheduling, truth, hooks
        )
        env.process(engine.run())
        if requests:
            engine.submit(list(requests))
    total = sum(len(r) for r in assignment.values())
    while len(done) < total and env.peek() != float("inf"):
        env.step()
    if len(done) < total:
        raise RuntimeError(f"{total - len(done)} requests never finished")
    ends: dict[int, float] = {}
    for c in done:
        ends[c.instance_id] = max(ends.get(c.instance_id, 0.0), c.gen_end_s or 0.0)
    return GenerationResult(max(ends.values(), default=0.0), ends, done)
