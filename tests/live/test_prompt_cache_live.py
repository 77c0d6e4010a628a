"""After a weight update, new requests never reuse prompt KV cached with the old weights.

Real vLLM (prefix caching on), real weight broadcast: long prompts are cached, the weights
change, then the same prompts must generate exactly what a request with no prefix sharing
generates (greedy), while a sequence in flight across the update keeps its KV (``keep``).
"""

from __future__ import annotations

import json
import re
import threading
import time

import httpx
import pytest
import torch

from runtime.procs import free_port
from runtime.trainer import TrainerConfig
from runtime.trainer_proc import ServerAddr, TrainerWorker

pytestmark = pytest.mark.live

MAX_TOKENS = 24


def _prompts() -> list[str]:
    """Three reverse-task prompts of ~330 tokens (several full KV blocks each)."""
    rng = torch.Generator().manual_seed(7)
    letters = "abcdefgh"
    out = []
    for _ in range(3):
        picks = torch.randint(0, len(letters), (330,), generator=rng).tolist()
        out.append("V:" + "".join(letters[i] for i in picks) + "=")
    return out


def _greedy(url: str, prompt: str, salt: str | None = None) -> list[int]:
    body = {"model": "tandem", "prompt": prompt, "max_tokens": MAX_TOKENS,
            "temperature": 0.0, "return_token_ids": True, "ignore_eos": True}  # fmt: skip
    if salt is not None:
        body["cache_salt"] = salt
    resp = httpx.post(url + "/v1/completions", json=body, timeout=120)
    resp.raise_for_status()
    return resp.json()["choices"][0]["token_ids"]


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    values = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
    return sum(float(v) for v in values)


@pytest.fixture(scope="module")
def worker(server, token, model_dir):
    """The trainer (in this process) joined to the server's weight group; the server
    gets the original weights back at the end (other tests expect the tiny model)."""
    w = TrainerWorker(TrainerConfig(model_dir, batch_size=4))
    w.initialise(None)
    w.join_group([ServerAddr(server, token)], "127.0.0.1", free_port(), "gloo")
    original = {k: v.clone() for k, v in w.trainer.model.state_dict().items()}
    yield w
    w.trainer.model.load_state_dict(original)
    w.push_weights(_version(server) + 1)


def _version(url: str) -> int:
    return int(httpx.get(url + "/health").json()["version"])


def _perturb_and_push(w: TrainerWorker, url: str, seed: int) -> int:
    """Change the attention key/value projections (so prompt KV changes); push."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in w.trainer.model.named_parameters():
            if "k_proj" in name or "v_proj" in name:
                p.add_(torch.randn(p.shape, generator=gen) * p.std())
    version = _version(url) + 1
    w.push_weights(version)
    return version


def test_new_requests_after_an_update_do_not_reuse_old_prompt_kv(server, worker):
    prompts = _prompts()
    before = [_greedy(server, p) for p in prompts]  # caches the prompts' full blocks
    assert [_greedy(server, p) for p in prompts] == before  # greedy is deterministic
    _perturb_and_push(worker, server, seed=1)
    after = [_greedy(server, p) for p in prompts]
    unshared = [_greedy(server, p, salt=f"probe-{i}") for i, p in enumerate(prompts)]
    print("\nprompt | after the update | no prefix sharing | equal")
    for i, (a, u) in enumerate(zip(after, unshared)):
        print(f"{i + 1} | {a[:10]} | {u[:10]} | {a == u}")
    assert after != before, "the update did not change the outputs: the test has no power"
    assert after == unshared


def _stream_one(url: str, prompt: str, max_tokens: int, out: dict) -> None:
    body = {"temperature": 0.0, "samples": [
        {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}]}  # fmt: skip
    with httpx.stream("POST", url + "/v1/tandem/generate", json=body, timeout=300) as resp:
        out["lines"] = [json.loads(x) for x in resp.iter_lines() if x]


def test_a_sequence_in_flight_keeps_its_kv_across_the_update(server, worker):
    start_version = _version(server)
    preempted = _metric(server, "vllm:num_preemptions_total")
    out: dict = {}
    prompt = _prompts()[0][:40] + "="  # short: 400 new tokens fit max_model_len
    thread = threading.Thread(target=_stream_one, args=(server, prompt, 400, out))
    thread.start()
    deadline = time.monotonic() + 60
    while _metric(server, "vllm:num_requests_running") < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)  # decoding
    _perturb_and_push(worker, server, seed=2)
    thread.join()
    (line,) = out["lines"]
    assert len(line["token_ids"]) == 400  # finished at full length after the update
    assert (line["version_start"], line["version_end"]) == (start_version, start_version + 1)
    assert line["version_prompt"] == start_version  # its prompt KV is the old version's
    assert _metric(server, "vllm:num_preemptions_total") == preempted  # no recompute


def test_a_version_number_loaded_again_does_not_reuse_prompt_kv_of_its_first_load(server, worker):
    """Before: update v (W1), request, v+1 (W2), v again (W2): the last request reused
    prompt blocks computed under W1 (the salt was the version number alone)."""
    prompt = _prompts()[1]
    version = _perturb_and_push(worker, server, seed=3)  # W1
    first = _greedy(server, prompt)  # caches the prompt's full blocks under W1
    _perturb_and_push(worker, server, seed=4)  # W2
    worker.push_weights(version)  # W2 again, under W1's number
    again = _greedy(server, prompt)
    unshared = _greedy(server, prompt, salt="probe-again")
    assert first != unshared, "W2 did not change the outputs: the test has no power"
    assert again == unshared
