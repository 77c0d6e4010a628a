"""``POST /v1/tandem/generate``: many samples in one HTTP request, streamed back one by one.

The actor's generation route. One request carries the samples of one dispatch (prompt,
``max_tokens``, priority, seed each); the server starts every one of them on vLLM's own
``AsyncLLM.generate`` at once and writes one JSON line per sample *the moment that
sample finishes* (newline-delimited JSON): a faithful stream of completions, without
the per-sample HTTP request, request validation and OpenAI response formatting of
``/v1/completions``, which on a CPU core cost as much as decoding the tiny model.

Each line: ``index`` (position in the request), ``token_ids``, ``logprobs`` (the
sampling log-prob of each token), ``text`` (every token but a final ``<eos>``, special
tokens by name; tandem's reward scores :func:`runtime.tasks.completion_text` of the token
ids instead), ``prompt_token_ids``, ``finish_reason``
``version_start`` / ``version_end`` — the served weight version when the sample was
added (after any update being loaded; its prompt is cache-salted with it) and when it
finished (an in-flight update in between makes them differ) — and ``version_prompt``,
the (oldest) version its prompt KV was computed with (:mod:`runtime.prompt_cache`).
A sample that fails (its prompt too long for the model, say) sends
``{"index": i, "error": "..."}`` in its place: the other samples of the request still
stream back, and the response holds exactly one line per sample.

While no sample has finished for ``heartbeat_s`` (default ``HEARTBEAT_S``) but the
engine has stepped meanwhile (:mod:`runtime.engine_watch`), the server writes an empty line, which readers skip: a
batch of long answers (thousands of tokens on a busy GPU) may finish nothing for many
minutes, and the silent stream met the client's read timeout and was taken for a broken
one. An engine that stopped stepping gets no heartbeat, so its silence still reaches the
client's timeout.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Callable

from pydantic import BaseModel, ConfigDict, Field

from runtime.prompt_cache import salt_version

HEARTBEAT_S = 10.0  # an empty line after this long without a finished sample
MAX_TEMPERATURE = 2.0  # vLLM's SamplingParams refuses more (policies.live_section too)
# vLLM's engine core receives requests over msgspec: an int past int64 failed there with an
# empty message ("EngineGenerateError:"); a seed is also never negative (-1: unseeded)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class SampleBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt: str = Field(min_length=1)
    max_tokens: int = Field(ge=1)  # prompt + max_tokens must fit the model's context
    priority: int = Field(0, ge=INT64_MIN, le=INT64_MAX)
    seed: int | None = Field(None, ge=0, le=INT64_MAX)
    ignore_eos: bool = False  # run all max_tokens (benchmarks and the profiler's decode bursts)


class BatchBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    samples: list[SampleBody] = Field(min_length=1)
    temperature: float = Field(1.0, ge=0, le=MAX_TEMPERATURE)
    heartbeat_s: float = Field(HEARTBEAT_S, ge=0.01, le=3600)  # see the module's docstring


async def drain(
    lines: asyncio.Queue[bytes], count: int, steps: Callable[[], int],
    heartbeat_s: float = HEARTBEAT_S,
) -> AsyncIterator[bytes]:  # fmt: skip
    """``count`` lines from ``lines`` as they come, those that come together in one chunk
    (the samples one engine step finishes: one write, one pass of the middleware stack);
    an empty line (a heartbeat) after every ``heartbeat_s`` without any in which the
    engine stepped (``steps()`` grew)."""
    left, seen = count, steps()
    while left:
        if not lines.empty():
            chunk = [lines.get_nowait()]
        else:
            try:
                async with asyncio.timeout(heartbeat_s):  # a timer; wait_for makes a task
                    chunk = [await lines.get()]
            except TimeoutError:
                if steps() != seen:
                    seen = steps()
                    yield b"\n"
                continue
        while not lines.empty():
            chunk.append(lines.get_nowait())
        left -= len(chunk)
        yield b"".join(chunk)


class BatchGenerator:
    """Runs a :class:`BatchBody` on the engine; yields the encoded lines of the samples
    finished since the last yield (one line each), as soon as there are any."""

    def __init__(self, engine, control) -> None:
        self.engine = engine
        self.control = control  # runtime.control.ServerControl: version, prompt KV version
        self.tokenizer = engine.get_tokenizer()

    async def stream(self, body: BatchBody) -> AsyncIterator[bytes]:
        inputs = self._fit_context(body, await self._render(body))
        lines: asyncio.Queue[bytes] = asyncio.Queue()
        batch_id = secrets.token_hex(6)
        tasks = []
        for i, (s, x) in enumerate(zip(body.samples, inputs)):
            if isinstance(x, Exception):  # this prompt cannot run: its line says why
                lines.put_nowait(_error_line(i, x))
                continue
            tasks.append(
                asyncio.create_task(self._one(f"tandem-{batch_id}-{i}", i, s, x, body, lines))
            )
        try:
            watch = getattr(self.control, "watch", None)  # runtime.engine_watch
            steps = lambda: watch.steps if watch is not None else 0  # noqa: E731
            async for chunk in drain(lines, len(body.samples), steps, body.heartbeat_s):
                yield chunk
        finally:
            for t in tasks:  # a client that went away aborts what is still running
                t.cancel()

    async def _render(self, body: BatchBody) -> list:
        """Every prompt rendered in one call; if that fails, one by one, so that a bad
        prompt (too long, say) costs its own sample only (an ``Exception`` in its place)."""
        prompts = [{"prompt": s.prompt} for s in body.samples]
        try:
            return list(await self.engine.renderer.render_cmpl_async(prompts))
        except Exception:  # noqa: BLE001 - find the bad ones below
            pass
        out: list = []
        for p in prompts:
            try:
                out.append((await self.engine.renderer.render_cmpl_async([p]))[0])
            except Exception as err:  # noqa: BLE001 - reported on its own line
                out.append(err)
        return out

    def _fit_context(self, body: BatchBody, inputs: list) -> list:
        """``inputs`` with an ``Exception`` in place of each sample whose prompt and
        ``max_tokens`` do not fit the model's context: vLLM cut such a sample short
        silently (``finish_reason`` "length"), as a too-long prompt it refuses."""
        max_model_len = getattr(getattr(self.engine, "model_config", None), "max_model_len", None)
        if not isinstance(max_model_len, int):
            return inputs
        out = list(inputs)
        for i, (s, x) in enumerate(zip(body.samples, inputs)):
            num_prompt = len(x.get("prompt_token_ids", ())) if isinstance(x, dict) else 0
            if not isinstance(x, Exception) and num_prompt + s.max_tokens > max_model_len:
                out[i] = ValueError(
                    f"samples[{i}].max_tokens: {s.max_tokens} after a prompt of {num_prompt} "
                    f"tokens exceeds the model's context of {max_model_len} tokens"
                )
        return out

    async def _one(self, request_id, index, sample, engine_input, body, lines) -> None:
        try:  # a sample whose params vLLM refuses gets an error line too: one line each
            params = _sampling_params(sample, body)
            final = None
            async for out in self.engine.generate(
                engine_input, params, request_id, priority=sample.priority
            ):
                final = out
            line = self._line(index, final, engine_input)
        except Exception as err:  # reported on the stream, the other samples go on
            lines.put_nowait(_error_line(index, err))
            return
        lines.put_nowait(json.dumps(line).encode() + b"\n")

    def _line(self, index: int, out, engine_input: dict) -> dict:
        # the engine salted the input with the version it was admitted at (in place)
        salted = salt_version(engine_input.get("cache_salt"))
        version_start = self.control.version if salted is None else salted
        c = out.outputs[0]
        token_ids = list(c.token_ids)
        return {
            "index": index,
            "token_ids": token_ids,
            "logprobs": [float(lp[t].logprob) for lp, t in zip(c.logprobs, token_ids)],
            "text": self._text(token_ids),
            "prompt_token_ids": list(out.prompt_token_ids),
            "finish_reason": c.finish_reason,
            "version_start": version_start,
            "version_end": self.control.version,
            "version_prompt": self.control.prompt_version(version_start, out),
        }

    def _text(self, token_ids: list[int]) -> str:
        """Every generated token but a final ``<eos>``, special ones by name: skipping them
        hid a ``<pad>`` or ``<unk>`` the model emitted (and trains on) from the text."""
        if token_ids and token_ids[-1] == self.tokenizer.eos_token_id:
            token_ids = token_ids[:-1]
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)


def _sampling_params(sample: SampleBody, body: BatchBody):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    # FINAL_ONLY: the engine hands over each sample once, when it finishes, instead of a
    # cumulative output every decode step; detokenize=False: the text is decoded once at
    # the end (BatchGenerator._line) rather than incrementally at every step
    return SamplingParams(
        max_tokens=sample.max_tokens, temperature=body.temperature, seed=sample.seed,
        ignore_eos=sample.ignore_eos, logprobs=0, output_kind=RequestOutputKind.FINAL_ONLY,
        detokenize=False,
    )  # fmt: skip


def _error_line(index: int, err: Exception) -> bytes:
    message = " ".join(f"{type(err).__name__}: {err}".split())  # one line
    return json.dumps({"index": index, "error": message}).encode() + b"\n"
