"""Warm the generation servers before a live run's clock starts.

A fresh vLLM engine answers its first requests slowly (the tiny model on the CPU: ~1.8 s
for the first, ~0.05 s later), which a run would otherwise count as generation time of
its first iteration. Each server gets one batch the shape of an iteration's (the spec's
batch size, ``live.warm_up_tokens`` tokens a sample, ``ignore_eos``) through the route
the actor generates through. Prompt KV it leaves in the cache is keyed by the weight
version the server serves, so nothing it computes is reused across an update.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import httpx

from policies.records import Request
from policies.spec import RunSpec
from runtime.errors import LiveRunError
from runtime.gen_client import GenerationClient
from runtime.tasks import task_set


def warm_up_requests(spec: RunSpec) -> list[Request]:
    """The warm-up batch: the first prompts of the run's task set."""
    tasks = task_set(spec)
    tokens = spec.live.warm_up_tokens
    return [
        Request(i, p.prompt_id, i, 0, p.prompt_tokens, tokens, prompt=p.text)
        for i, p in enumerate(tasks[i % len(tasks)] for i in range(spec.algorithm.batch_size))
    ]


async def warm_up_servers(clients: Mapping[int, GenerationClient], spec: RunSpec) -> float:
    """Send every server the warm-up batch at once; returns the seconds it took (0 when
    ``live.warm_up_tokens`` is 0)."""
    if spec.live.warm_up_tokens == 0 or not clients:
        return 0.0
    requests = warm_up_requests(spec)
    priorities = [0] * len(requests)
    seeds = [1_000_000 + r.sample_id for r in requests]

    async def one(client: GenerationClient) -> None:
        clock = time.perf_counter
        try:
            stream = client.stream(requests, 0.0, clock, priorities, seeds, ignore_eos=True)
            async for _ in stream:
                pass
        except httpx.HTTPError as err:  # one line naming the server, not httpx's traceback
            said = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
            raise LiveRunError(
                f"server {client.instance_id} ({client.base_url}) did not answer the warm-up "
                f"batch: {said}"
            ) from None

    start = time.perf_counter()
    await asyncio.gather(*(one(c) for c in clients.values()))
    return time.perf_counter() - start
