"""Prompt KV shared within one weight version only: salts, version history, prompt versions."""

from __future__ import annotations

import asyncio

import pytest

from policies.records import Completion, FinishReason, Request, SampleRecord
from runtime.prompt_cache import (
    ServedWeights,
    VersionHistory,
    install_salting,
    prompt_version,
    salt_prompt,
    salt_version,
    version_salt,
)


def test_salts_name_the_version_and_load_and_keep_the_callers_salt():
    assert version_salt(ServedWeights(3)) == "tandem-v3.l0"
    assert version_salt(ServedWeights(12, 4), "user") == "tandem-v12.l4|user"
    assert salt_version("tandem-v12.l4|user") == 12
    assert salt_version("user") is None and salt_version(None) is None
    assert salt_version("tandem-vX") is None


def test_salt_prompt_sets_the_salt_on_every_kind_of_prompt():
    engine_input = {"type": "token", "prompt_token_ids": [1, 2], "cache_salt": "mine"}
    assert salt_prompt(engine_input, ServedWeights(4, 1)) is engine_input
    assert engine_input["cache_salt"] == "tandem-v4.l1|mine"
    assert salt_prompt("text", ServedWeights(2)) == {"prompt": "text", "cache_salt": "tandem-v2.l0"}

    class CoreRequest:
        cache_salt = None

    request = CoreRequest()
    salt_prompt(request, ServedWeights(7, 7))
    assert request.cache_salt == "tandem-v7.l7"
    with pytest.raises(TypeError, match="int"):
        salt_prompt(5, ServedWeights(1))


class _Receiving:
    """An engine whose worker loads every update it is sent, between two steps."""

    class vllm_config:  # noqa: N801 - vLLM's attribute
        max_concurrent_batches = 1

    async def collective_rpc(self, method: str, timeout: float, args: tuple) -> list:
        return [{"receive_ms": 1.0}]


def test_a_version_number_loaded_again_salts_apart_from_its_first_load():
    """Seen live: update v10 (weights W1), request, v11 (W2), v10 again (W2): a request
    reused prompt blocks computed under W1 (the salt was the version number alone). A run
    attached to a long-lived server, or resumed, counts versions from where it starts."""
    from runtime.control import ServerControl
    from runtime.weight_sync import BucketDigest, ParamMeta

    metas = [ParamMeta("w", (2,), "float32")]
    digests = [BucketDigest("float32", 1, 8, "0" * 32)]
    control = ServerControl(_Receiving(), {"w": ((2,), "float32")})

    async def salts() -> list[str]:
        out = []
        for version in (10, 11, 10):
            await control.update(version, metas, digests, timeout_s=5.0)
            out.append(version_salt(await control.admit()))
        return out

    first, _, again = asyncio.run(salts())
    assert salt_version(first) == salt_version(again) == 10
    assert first != again


def test_version_history_answers_the_version_served_at_a_time():
    history = VersionHistory(initial_version=0)
    history.served(1, since_ts=10.0)
    history.served(2, since_ts=20.0)
    assert [history.version_at(t) for t in (5.0, 10.0, 15.0, 20.0, 99.0)] == [0, 1, 1, 2, 2]


def test_prompt_version_of_a_request_queued_across_an_update():
    assert prompt_version(3, None, 128) == 3  # scheduled time unknown: its salt's version
    assert prompt_version(3, 3, 0) == 3  # scheduled before any update
    assert prompt_version(3, 4, 0) == 4  # waited across the update, computed afresh
    assert prompt_version(3, 4, 64) == 3  # reused salt-3 blocks: the oldest possible


def test_installed_salting_waits_for_the_admitted_version():
    calls = []

    class Engine:
        async def add_request(self, request_id, prompt, params, **kwargs):
            calls.append((request_id, prompt["cache_salt"], kwargs))
            return "queue"

    async def admit() -> ServedWeights:
        return ServedWeights(5, 2)

    engine = Engine()
    install_salting(engine, admit)
    prompt = {"type": "token", "prompt_token_ids": [1]}
    assert asyncio.run(engine.add_request("r1", prompt, None, priority=2)) == "queue"
    assert calls == [("r1", "tandem-v5.l2", {"priority": 2})]


def test_staleness_counts_from_the_prompt_kv_version():
    request = Request(1, 0, 0, 0, 8, 16)
    c = Completion(request, 0, 4, FinishReason.STOP, 2, 3, 0.0, 0.0, 1.0, version_prompt=3)
    record = SampleRecord.from_completion(c, train_step=4)
    assert (record.version_prompt, record.staleness) == (3, 1)
    plain = Completion(request, 0, 4, FinishReason.STOP, 2, 3, 0.0, 0.0, 1.0)
    assert SampleRecord.from_completion(plain, train_step=4).staleness == 2
    assert SampleRecord.from_completion(plain).staleness is None


def test_the_stream_route_line_gives_each_completion_its_prompt_version():
    from runtime.gen_client import GenerationClient

    client = GenerationClient(0, "http://127.0.0.1:1", 1.0)
    request = Request(1, 0, 0, 0, 8, 16, prompt="x")
    line = {"index": 0, "token_ids": [3, 4], "logprobs": [-0.1, -0.2], "text": "ab",
            "prompt_token_ids": [5], "finish_reason": "stop", "version_start": 2,
            "version_end": 3, "version_prompt": 2}  # fmt: skip
    out = client._streamed(line, [request], 0.0, 0.1, 0.2)
    assert (out.completion.version_start, out.completion.version_prompt) == (2, 2)
    asyncio.run(client.aclose())
