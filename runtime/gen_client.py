"""HTTP client of one generation server: requests in, :class:`Completion` objects out.

:meth:`GenerationClient.stream` sends the samples of one dispatch in one request to the
server's ``/v1/tandem/generate`` and yields each completion the moment the server
streams it back (see :mod:`runtime.batch_gen`); :meth:`GenerationClient.generate` is the
one-sample OpenAI ``/v1/completions`` path. Either way a completion's text is made here
from its token ids (:func:`runtime.tasks.completion_text`, one character per token), not
taken from the server: vLLM's ``/v1/completions`` drops the special tokens the model
emitted (and trains on), and ``/v1/tandem/generate`` writes them by name.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import httpx

from policies.records import Completion, FinishReason, Request
from runtime.engine_proc import SERVED_MODEL_NAME
from runtime.http_pool import POOL_LIMITS
from runtime.procs import health_says
from runtime.tasks import completion_text

# a stream silent this long is broken: a server whose engine steps sends an empty line
# every 10 s (runtime/batch_gen.py) while no sample finishes
STREAM_READ_TIMEOUT_S = 120.0
HEALTH_TIMEOUT_S = 2.0  # a /health probe beside a running stream
ENGINE_DEAD = "EngineDeadError"  # in a sample's error line: the server's engine died


class SampleFailed(RuntimeError):
    """The server could not generate one sample (its error line names why)."""

    def __init__(self, request: Request, instance_id: int, error: str) -> None:
        super().__init__(
            f"sample {request.sample_id} (prompt {request.prompt_id}) failed on generation "
            f"server {instance_id}: {error}"
        )
        self.request = request


@dataclass(slots=True, frozen=True)
class Generated:
    """A completion plus what only the live runtime knows about it."""

    completion: Completion
    text: str  # what the reward scores: runtime.tasks.completion_text of the token ids
    prompt_ids: tuple[int, ...]


def completion_body(request: Request, temperature: float, priority: int, seed: int | None) -> dict:
    body = {
        "model": SERVED_MODEL_NAME,
        "prompt": request.prompt,
        "max_tokens": request.max_tokens,
        "temperature": temperature,
        "logprobs": 1,
        "return_token_ids": True,
        "priority": priority,
    }
    if seed is not None:
        body["seed"] = seed
    return body


class GenerationClient:
    """Sends completions to one server (``instance_id``) over a shared connection pool."""

    def __init__(
        self,
        instance_id: int,
        base_url: str,
        temperature: float,
        api_key: str | None = None,
        task_tokens: bool = True,
    ) -> None:
        self.instance_id = instance_id
        self.base_url = base_url
        self.temperature = temperature
        self.api_key = api_key
        # the served tokenizer is the tasks' (one character a token): the reward's text is
        # made from the token ids; another model's text is its server's decode
        self.task_tokens = task_tokens
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self._http = httpx.AsyncClient(
            base_url=base_url, timeout=600.0, limits=POOL_LIMITS, headers=headers
        )

    async def generate(
        self, request: Request, dispatch_s: float, clock, priority: int = 0, seed: int | None = None
    ) -> Generated:
        if request.prompt is None:
            raise ValueError(f"request {request.sample_id} has no prompt text")
        start_s = clock()
        body = completion_body(request, self.temperature, priority, seed)
        resp = await self._http.post("/v1/completions", json=body)
        end_s = clock()
        resp.raise_for_status()
        choice = resp.json()["choices"][0]
        token_ids = tuple(choice["token_ids"])
        completion = Completion(
            request=request,
            instance_id=self.instance_id,
            output_tokens=len(token_ids),
            finish_reason=_finish_reason(choice["finish_reason"]),
            version_start=int(resp.headers["x-tandem-version-start"]),
            version_end=int(resp.headers["x-tandem-version-end"]),
            dispatch_s=dispatch_s,
            gen_start_s=start_s,
            gen_end_s=end_s,
            token_ids=token_ids,
            logprobs=tuple(float(x) for x in choice["logprobs"]["token_logprobs"]),
        )
        text = completion_text(token_ids) if self.task_tokens else choice["text"]
        return Generated(completion, text, tuple(choice["prompt_token_ids"]))

    def reconnected(self, base_url: str) -> GenerationClient:
        """A new client for the same instance (a restarted server: fresh connections)."""
        return self.for_instance(self.instance_id, base_url)

    def for_instance(self, instance_id: int, base_url: str) -> GenerationClient:
        """A client with this one's settings for another server (an added instance)."""
        return GenerationClient(
            instance_id, base_url, self.temperature, self.api_key, self.task_tokens
        )

    @property
    def http(self) -> httpx.AsyncClient:
        """The pooled HTTP client (keep-alive connections to this server)."""
        return self._http

    async def stream(
        self, requests: Sequence[Request], dispatch_s: float, clock: Callable[[], float],
        priorities: Sequence[int], seeds: Sequence[int | None], ignore_eos: bool = False,
    ) -> AsyncIterator[Generated]:  # fmt: skip
        """Generate ``requests`` in one HTTP request; yield each completion as it finishes
        (``ignore_eos``: every sample runs its ``max_tokens``, for timing)."""
        samples = [
            {"prompt": r.prompt, "max_tokens": r.max_tokens, "priority": p, "seed": s}
            for r, p, s in zip(requests, priorities, seeds)
        ]
        if ignore_eos:
            samples = [{**x, "ignore_eos": True} for x in samples]
        body = {"temperature": self.temperature, "samples": samples}
        start_s = clock()
        timeout = httpx.Timeout(600.0, read=STREAM_READ_TIMEOUT_S)
        async with self._http.stream(
            "POST", "/v1/tandem/generate", json=body, timeout=timeout
        ) as resp:
            resp.raise_for_status()
            async for line in resp.aiter_lines():
                if line:
                    yield self._streamed(json.loads(line), requests, dispatch_s, start_s, clock())

    def _streamed(self, d: dict, requests, dispatch_s, start_s, end_s) -> Generated:
        if "error" in d:
            raise SampleFailed(requests[d["index"]], self.instance_id, d["error"])
        token_ids = tuple(d["token_ids"])
        completion = Completion(
            request=requests[d["index"]],
            instance_id=self.instance_id,
            output_tokens=len(token_ids),
            finish_reason=_finish_reason(d["finish_reason"]),
            version_start=d["version_start"],
            version_end=d["version_end"],
            dispatch_s=dispatch_s,
            gen_start_s=start_s,
            gen_end_s=end_s,
            token_ids=token_ids,
            logprobs=tuple(d["logprobs"]),
            version_prompt=d.get("version_prompt"),
        )
        text = completion_text(token_ids) if self.task_tokens else d["text"]
        return Generated(completion, text, tuple(d["prompt_token_ids"]))

    async def unwell(self) -> str | None:
        """What the server's ``/health`` says where its engine cannot serve (a 503: stalled,
        dead or stuck), else None: a 200, or no answer at all (the stream tells of that)."""
        try:
            health = await self._http.get("/health", timeout=HEALTH_TIMEOUT_S)
        except httpx.HTTPError:
            return None
        return health_says(health) if health.status_code == 503 else None

    async def health(self) -> dict:
        resp = await self._http.get("/health")
        resp.raise_for_status()
        return resp.json()

    async def aclose(self) -> None:
        await self._http.aclose()


def _finish_reason(reason: str | None) -> FinishReason:
    return FinishReason.LENGTH if reason == "length" else FinishReason.STOP
