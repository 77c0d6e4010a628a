"""The profiler's generation bursts: concurrent samples that all run a fixed number of
tokens, through the live actor's route (``/v1/tandem/generate`` with ``ignore_eos``) or
``/v1/completions``, and the warm-up a server gets before it is measured."""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx

from policies.records import Request
from policies.spec import RunSpec
from runtime.gen_client import completion_body
from runtime.http_pool import POOL_LIMITS
from runtime.tasks import TaskPrompt, TaskSet, task_set


def prompt_slice(tasks: TaskSet, count: int, offset: int) -> list[TaskPrompt]:
    return [tasks[(offset + i) % len(tasks)] for i in range(count)]


async def burst_s(
    http: httpx.AsyncClient, prompts: list[TaskPrompt], max_tokens: int, temperature: float
) -> float:
    """Wall time of one burst of concurrent samples that all run ``max_tokens`` tokens,
    through the route the live actor generates through (:data:`ACTOR_ROUTE`)."""
    url = str(http.base_url)
    return await route_burst_s(url, prompts, max_tokens, temperature, ignore_eos=True)


async def completions_burst_s(
    http: httpx.AsyncClient, prompts: list[TaskPrompt], max_tokens: int, temperature: float
) -> float:
    """Wall time of one burst of concurrent ``/v1/completions`` (``ignore_eos``)."""
    bodies = []
    for i, p in enumerate(prompts):
        request = Request(i, p.prompt_id, i, 0, p.prompt_tokens, max_tokens, prompt=p.text)
        bodies.append({**completion_body(request, temperature, 0, 1000 + i), "ignore_eos": True})
    for attempt in range(3):
        start = time.perf_counter()
        try:
            answers = await asyncio.gather(*(http.post("/v1/completions", json=b) for b in bodies))
            break
        except httpx.TransportError:  # a connection dropped: measure the burst again
            if attempt == 2:
                raise
    elapsed = time.perf_counter() - start
    for resp in answers:
        resp.raise_for_status()
        got = len(resp.json()["choices"][0]["token_ids"])
        if got != max_tokens:
            raise RuntimeError(f"profile burst: asked {max_tokens} tokens, got {got}")
    return elapsed


WARM_UP_BURSTS = ((8, 16), (32, 64), (64, 32))  # (requests, tokens): a cold server is slower


async def warm_up(http: httpx.AsyncClient, tasks: TaskSet, temperature: float) -> None:
    for count, max_tokens in WARM_UP_BURSTS:
        await burst_s(http, prompt_slice(tasks, count, 3), max_tokens, temperature)


def warm_up_server(base_url: str, spec: RunSpec) -> None:
    """The profile's warm-up bursts, for a server that will be measured (``tandem fidelity``)."""

    async def run() -> None:
        async with httpx.AsyncClient(base_url=base_url, timeout=600.0, limits=POOL_LIMITS) as http:
            await warm_up(http, tasks, spec.live.temperature)

    tasks = task_set(spec)
    asyncio.run(run())


async def median_burst(http, prompts, max_tokens, temperature, repeats) -> float:
    return statistics.median(
        [await burst_s(http, prompts, max_tokens, temperature) for _ in range(repeats)]
    )


ACTOR_ROUTE = "tandem-generate"  # GenerationClient.stream: batched /v1/tandem/generate


async def route_burst_s(
    url: str, prompts: list[TaskPrompt], max_tokens: int, temperature: float,
    ignore_eos: bool = False,
) -> float:  # fmt: skip
    """Wall time of one burst through the actor's own route (``GenerationClient.stream``);
    with ``ignore_eos`` every sample must come back with ``max_tokens`` tokens."""
    from runtime.gen_client import GenerationClient

    requests = [
        Request(i, p.prompt_id, i, 0, p.prompt_tokens, max_tokens, prompt=p.text)
        for i, p in enumerate(prompts)
    ]
    client = GenerationClient(0, url, temperature)
    try:
        start = time.perf_counter()
        seeds = [1000 + i for i in range(len(prompts))]
        priorities = [0] * len(prompts)
        async for out in client.stream(
            requests, 0.0, time.perf_counter, priorities, seeds, ignore_eos=ignore_eos
        ):
            got = out.completion.output_tokens
            if ignore_eos and got != max_tokens:
                raise RuntimeError(f"profile burst: asked {max_tokens} tokens, got {got}")
        return time.perf_counter() - start
    finally:
        await client.aclose()


async def prefill_s(http, prompts, temperature, repeats) -> tuple[float, float]:
    """(prefill through the actor's route, ``max_tokens=1`` burst of ``/v1/completions``)."""
    times = [await completions_burst_s(http, prompts, 1, temperature) for _ in range(repeats)]
    return await median_burst(http, prompts, 1, temperature, repeats), statistics.median(times)
