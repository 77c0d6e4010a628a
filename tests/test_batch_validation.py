"""The batch route refuses what vLLM cannot run, naming the field, and answers every
sample with exactly one line whatever fails (runtime/batch_gen.py)."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import ValidationError

import runtime.batch_gen
from runtime.batch_gen import BatchBody, BatchGenerator


class _Config:
    max_model_len = 512


class _Engine:
    """Renders a prompt as one token per character; generates one token."""

    model_config = _Config()

    def __init__(self) -> None:
        self.renderer = self

    def get_tokenizer(self) -> None:
        return None

    async def render_cmpl_async(self, prompts: list[dict]) -> list[dict]:
        return [{"prompt_token_ids": list(range(len(p["prompt"])))} for p in prompts]

    async def generate(self, engine_input, params, request_id, priority=0):
        raise AssertionError("not reached in these tests")
        yield


def _lines(body: BatchBody) -> list[dict]:
    async def run() -> list[bytes]:
        return [c async for c in BatchGenerator(_Engine(), control=None).stream(body)]

    return [json.loads(x) for x in b"".join(asyncio.run(run())).splitlines()]


@pytest.mark.parametrize("temperature", [2.5, float("inf"), 1e300, float("nan"), -0.1])
def test_a_temperature_vllm_refuses_is_refused_naming_it(temperature):
    """Before: 3.0 passed, vLLM's SamplingParams raised outside the sample's try, and the
    stream sent heartbeats for ever."""
    with pytest.raises(ValidationError, match="temperature"):
        BatchBody(temperature=temperature, samples=[{"prompt": "x", "max_tokens": 1}])
    assert BatchBody(temperature=2.0, samples=[{"prompt": "x", "max_tokens": 1}])


@pytest.mark.parametrize(
    ("field", "value"), [("seed", 2**64), ("seed", -1), ("priority", 2**80), ("priority", -(2**70))]
)
def test_a_seed_or_priority_past_int64_is_refused_naming_it(field, value):
    """Before: {"error": "EngineGenerateError:"}, with no word of what was wrong."""
    with pytest.raises(ValidationError, match=field):
        BatchBody(samples=[{"prompt": "x", "max_tokens": 1, field: value}])
    BatchBody(samples=[{"prompt": "x", "max_tokens": 1, "seed": 2**63 - 1, "priority": -5}])


def test_a_sample_whose_params_fail_gets_an_error_line(monkeypatch):
    """Exactly one line per sample, also when building a sample's params raises."""

    def refuse(sample, body):
        raise ValueError("temperature must be in [0, 2], got 3.0.")

    monkeypatch.setattr(runtime.batch_gen, "_sampling_params", refuse)
    body = BatchBody(samples=[{"prompt": "x", "max_tokens": 1}] * 2, heartbeat_s=0.05)
    lines = asyncio.run(asyncio.wait_for(asyncio.to_thread(_lines, body), 10))
    assert sorted(x["index"] for x in lines) == [0, 1]
    assert all("temperature must be in [0, 2]" in x["error"] for x in lines)


def test_max_tokens_past_the_context_gets_an_error_line_naming_it(monkeypatch):
    """Before: max_tokens 10000 after a 15-token prompt gave 497 tokens, finish "length"."""
    monkeypatch.setattr(runtime.batch_gen, "_sampling_params", lambda s, b: 1 / 0)
    samples = [{"prompt": "x" * 12, "max_tokens": 500}, {"prompt": "x" * 12, "max_tokens": 10**12}]
    lines = {x["index"]: x["error"] for x in _lines(BatchBody(samples=samples))}
    assert lines[0].startswith("ZeroDivisionError")  # 512 tokens fit: it ran
    assert (
        "samples[1].max_tokens: 1000000000000 after a prompt of 12 tokens exceeds the "
        "model's context of 512 tokens" in lines[1]
    )
