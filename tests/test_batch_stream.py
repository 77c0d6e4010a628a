"""The batch route writes the samples that finish together in one chunk, one line each."""

from __future__ import annotations

import asyncio
import json

from runtime.batch_gen import BatchBody, BatchGenerator


class _Engine:
    def get_tokenizer(self) -> None:
        return None


class _Scripted(BatchGenerator):
    """Samples finish in the groups ``finish`` names (indices), one engine step apart."""

    def __init__(self, finish: list[list[int]]) -> None:
        super().__init__(_Engine(), control=None)
        self.finish = finish

    async def _render(self, body: BatchBody) -> list:
        return [{"prompt": s.prompt} for s in body.samples]

    async def _one(self, request_id, index, sample, engine_input, body, lines) -> None:
        step = next(k for k, group in enumerate(self.finish) if index in group)
        for _ in range(step + 1):
            await asyncio.sleep(0)  # one engine step: every task of the step runs first
            await asyncio.sleep(0.01)
        lines.put_nowait(json.dumps({"index": index}).encode() + b"\n")


async def _chunks(gen: BatchGenerator, n: int) -> list[bytes]:
    body = BatchBody(samples=[{"prompt": "N:3=", "max_tokens": 4}] * n)
    return [chunk async for chunk in gen.stream(body)]


def test_samples_finished_together_share_one_write() -> None:
    chunks = asyncio.run(_chunks(_Scripted([[0, 2, 3], [1], [4, 5]]), 6))
    per_chunk = [sorted(json.loads(x)["index"] for x in c.splitlines()) for c in chunks]
    assert per_chunk == [[0, 2, 3], [1], [4, 5]]
    assert all(c.endswith(b"\n") for c in chunks)  # whole lines only


def test_every_sample_has_exactly_one_line() -> None:
    chunks = asyncio.run(_chunks(_Scripted([[3], [0, 1, 2, 4, 5, 6, 7]]), 8))
    lines = b"".join(chunks).splitlines()
    assert sorted(json.loads(x)["index"] for x in lines) == list(range(8))


class _CharEngine:
    def get_tokenizer(self):
        from runtime.model import build_tokenizer

        return build_tokenizer()


class _Control:
    version = 0

    def prompt_version(self, version_start: int, out) -> int:
        return version_start


def test_the_line_text_keeps_special_tokens_and_drops_the_final_eos() -> None:
    from types import SimpleNamespace

    from runtime.tasks import VOCAB

    ids = [VOCAB.index(t) for t in ("g", "e", "<unk>", "c", "<pad>", "<eos>")]
    logprobs = [{t: SimpleNamespace(logprob=-0.5)} for t in ids]
    out = SimpleNamespace(
        outputs=[SimpleNamespace(token_ids=ids, logprobs=logprobs, finish_reason="stop")],
        prompt_token_ids=[3],
    )
    line = BatchGenerator(_CharEngine(), _Control())._line(0, out, {})
    assert (line["token_ids"], line["text"]) == (ids, "ge<unk>c<pad>")
