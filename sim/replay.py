"""Replay a trace of requests through one simulated engine's scheduler, step by step, with
no time and no cost model: what the scheduler decides each step, to compare with what a
real vLLM engine decided on the same trace (``runtime.engine_trace``).

Every request arrives before the first step, in trace order; each generates exactly its
``output_tokens`` (vLLM with ``ignore_eos`` and per-request ``max_tokens``); requests of one
``prompt_group`` have the same prompt, so they share its cached blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.records import FinishReason, Request, SchedulerStep, TraceRequest
from sim.scheduler import Scheduler
from sim.sequence import NULL_BLOCKS, EngineLimits


def limits_from_engine_args(args: dict) -> EngineLimits:
    """The simulated engine's limits from vLLM engine arguments (``num_gpu_blocks_override``
    given: the cache's blocks, one of them vLLM's null block)."""
    return EngineLimits(
        max_num_seqs=args["max_num_seqs"],
        max_num_batched_tokens=args["max_num_batched_tokens"],
        block_size=args["block_size"],
        num_blocks=args["num_gpu_blocks_override"] - NULL_BLOCKS,
        enable_chunked_prefill=args.get("enable_chunked_prefill", True),
        enable_prefix_caching=args.get("enable_prefix_caching", True),
        scheduling_policy=args.get("scheduling_policy", "fcfs"),
    )


def replay_schedule(
    trace: Sequence[TraceRequest], limits: EngineLimits, max_steps: int = 10**6
) -> list[SchedulerStep]:
    """The scheduler's steps on ``trace`` until every request finished."""
    scheduler = Scheduler(limits)
    for i, r in enumerate(trace):
        request = Request(i, r.prompt_group, r.prompt_group, 0, r.prompt_tokens, r.output_tokens)
        scheduler.add(request, r.output_tokens, FinishReason.LENGTH, r.priority, 0, 0)
    steps: list[SchedulerStep] = []
    while not scheduler.idle:
        if len(steps) >= max_steps:
            raise RuntimeError(f"replay did not finish within {max_steps} steps")
        plan = scheduler.schedule()
        scheduler.finish_step(plan)
        steps.append(
            SchedulerStep(
                num_requests=plan.num_scheduled,
                num_tokens=plan.num_decode + plan.num_prefill_tokens,
                num_new=sum(1 for s in plan.admitted if s.num_preemptions == 0),
                num_preempted=plan.num_preempted,
            )
        )
    return steps
