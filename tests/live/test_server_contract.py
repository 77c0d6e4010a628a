"""The generation server's PipelineRL contract on real vLLM over real HTTP."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from runtime.procs import free_port
from runtime.tasks import TaskSet
from runtime.trainer import TrainerConfig, TrainItem, token_logprobs
from runtime.trainer_proc import ServerAddr, TrainerWorker

pytestmark = pytest.mark.live


def _auth(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def _complete(url: str, prompt: str, max_tokens: int, min_tokens: int = 0) -> httpx.Response:
    body = {"model": "tandem", "prompt": prompt, "max_tokens": max_tokens, "min_tokens": min_tokens,
            "logprobs": 1, "return_token_ids": True, "temperature": 1.0, "seed": 1}  # fmt: skip
    resp = httpx.post(url + "/v1/completions", json=body, timeout=120)
    resp.raise_for_status()
    return resp


@pytest.fixture(scope="module")
def worker(server, token, model_dir):
    """The trainer (in this process) joined to the server's weight group."""
    w = TrainerWorker(TrainerConfig(model_dir, batch_size=4, learning_rate=1e-2))
    w.initialise(None)
    w.join_group([ServerAddr(server, token)], "127.0.0.1", free_port(), "gloo")
    return w


def _train_once(w: TrainerWorker, step: int) -> None:
    item = TrainItem(0, (23, 14, 21, 3, 22), (3, 1), (-1.0, -1.0), 1.0, 1.0, step)
    w.train([item, TrainItem(1, (23, 14, 21, 3, 22), (4, 1), (-1.0, -1.0), -1.0, 0.0, step)], 0.0)
    w.step(step, 0.0)


def test_completions_return_token_ids_logprobs_and_version(server):
    resp = _complete(server, TaskSet(0, 1, 64)[0].text, 16)
    choice = resp.json()["choices"][0]
    assert choice["token_ids"] and len(choice["logprobs"]["token_logprobs"]) == len(
        choice["token_ids"]
    )
    assert choice["prompt_token_ids"]
    assert resp.headers["x-tandem-version-start"] == resp.headers["x-tandem-version-end"]


def test_batch_route_streams_each_completion_with_ids_logprobs_and_versions(server):
    tasks = TaskSet(0, 3, 64)
    body = {"temperature": 1.0, "samples": [
        {"prompt": p.text, "max_tokens": 8 * (i + 1), "priority": 0} for i, p in enumerate(tasks.prompts)
    ]}  # fmt: skip
    with httpx.stream("POST", server + "/v1/tandem/generate", json=body, timeout=120) as resp:
        assert resp.status_code == 200
        lines = [json.loads(x) for x in resp.iter_lines() if x]
    assert sorted(d["index"] for d in lines) == [0, 1, 2]
    for d in lines:
        assert 0 < len(d["token_ids"]) == len(d["logprobs"]) <= 8 * (d["index"] + 1)
        assert d["prompt_token_ids"] and d["version_start"] == d["version_end"]
        assert all(lp <= 0 for lp in d["logprobs"])
    bad = httpx.post(server + "/v1/tandem/generate", json={"samples": [{"prompt": "x"}]})
    assert 400 <= bad.status_code < 500 and "max_tokens" in bad.text


def test_a_stream_that_finishes_nothing_for_a_while_sends_heartbeats_while_the_engine_steps(
    server,
):
    """Before: a batch of long answers that finished nothing for the client's read timeout
    (600 s) was taken for a broken stream and sent again. A real engine's steps now keep
    it alive with empty lines (here every 50 ms over a ~300-step answer)."""
    body = {"heartbeat_s": 0.05, "samples": [
        {"prompt": TaskSet(0, 1, 64)[0].text, "max_tokens": 300, "ignore_eos": True}
    ]}  # fmt: skip
    with httpx.stream("POST", server + "/v1/tandem/generate", json=body, timeout=120) as resp:
        assert resp.status_code == 200
        raw = list(resp.iter_lines())
    answers = [json.loads(x) for x in raw if x]
    assert len(answers) == 1 and len(answers[0]["token_ids"]) == 300
    assert raw.count("") >= 2 and raw[-1] != ""  # heartbeats, then the answer


def test_inflight_update_lets_requests_finish_and_spans_both_versions(
    server, worker, server_process
):
    # the uni executor runs one step at a time: updates load between steps, unpaused
    health = httpx.get(server + "/health").json()
    assert health["pauses_for_updates"] is False
    assert health["pid"] == server_process.proc.pid  # how a launcher knows its own server
    version = int(httpx.get(server + "/health").json()["version"]) + 1
    _train_once(worker, version - 1)
    out: dict = {}

    def long_request() -> None:
        out["resp"] = _complete(server, "R40:abc=", 300, min_tokens=300)

    thread = threading.Thread(target=long_request)
    thread.start()
    while httpx.get(server + "/metrics").text.find("vllm:num_requests_running") < 0:
        pass
    import time

    time.sleep(0.3)  # the request is decoding
    result = worker.push_weights(version)
    thread.join()
    resp = out["resp"]
    assert len(resp.json()["choices"][0]["token_ids"]) == 300  # finished at full length
    assert int(resp.headers["x-tandem-version-start"]) == version - 1
    assert int(resp.headers["x-tandem-version-end"]) == version
    assert result.pause_s[0] > 0
    print(f"in-flight update pause: {result.pause_s[0] * 1000:.1f} ms")


def test_served_weights_equal_trainer_weights(server, token, worker):
    version = int(httpx.get(server + "/health").json()["version"]) + 1
    _train_once(worker, version - 1)
    result = worker.push_weights(version)
    assert result.stages_ms[0]["direct_load"] == 1.0  # copied in place (runtime/direct_load.py)
    served = httpx.get(server + "/weights/checksums", headers=_auth(token)).json()
    mine = worker.checksums()
    assert served["version"] == version
    assert set(served["checksums"]) == set(mine)
    for name, (total, squares) in mine.items():
        assert served["checksums"][name] == pytest.approx([total, squares], rel=1e-9, abs=1e-9), (
            name
        )
    # and the served model computes the trainer's log-probs (the loaded weights are live)
    resp = _complete(server, "R3:ab=", 12)
    choice = resp.json()["choices"][0]
    item = TrainItem(
        0, tuple(choice["prompt_token_ids"]), tuple(choice["token_ids"]), (), 0.0, 0.0, 0
    )
    logp, _ = token_logprobs(worker.trainer.model, [item])
    served_logp = choice["logprobs"]["token_logprobs"]
    assert logp[0, : len(served_logp)].tolist() == pytest.approx(served_logp, abs=2e-3)


@pytest.mark.parametrize(
    "route", ["/init_process_group", "/request_weight_update", "/weights/checksums"]
)
@pytest.mark.parametrize("header", [None, "Bearer wrong", "secret"])
def test_control_routes_refuse_missing_or_wrong_token(server, route, header):
    headers = {"Authorization": header} if header else {}
    method = httpx.get if route == "/weights/checksums" else httpx.post
    kwargs = {} if method is httpx.get else {"json": {}}
    resp = method(server + route, headers=headers, timeout=10, **kwargs)
    # no token, or one without the Bearer scheme: 401 (a Bearer token is expected);
    # a wrong Bearer token: 403
    assert resp.status_code == (403 if header == "Bearer wrong" else 401)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"params": [{"name": "x", "shape": [1], "dtype": "float32"}]}, "version"),
        ({"version": "one", "params": []}, "version"),
        ({"version": 1, "params": [{"name": "lm_head.weight", "shape": [1]}]}, "dtype"),
        (
            {"version": 1, "params": [{"name": "nope", "shape": [1], "dtype": "float32"}]},
            "params[0].name",
        ),
        (
            {
                "version": 1,
                "params": [{"name": "lm_head.weight", "shape": [3], "dtype": "float32"}],
            },
            "params[0].shape",
        ),
    ],
)
def test_malformed_weight_update_gets_4xx_naming_the_field(server, token, body, field):
    before = httpx.get(server + "/health").json()
    resp = httpx.post(
        server + "/request_weight_update", json=body, headers=_auth(token), timeout=10
    )
    assert 400 <= resp.status_code < 500
    assert field in resp.text
    after = httpx.get(server + "/health").json()
    assert after["version"] == before["version"] and after["num_updates"] == before["num_updates"]


def test_malformed_init_process_group_gets_4xx_naming_the_field(server, token):
    body = {"master_addr": "127.0.0.1", "master_port": 99999, "rank": 1, "world_size": 2}
    resp = httpx.post(server + "/init_process_group", json=body, headers=_auth(token), timeout=10)
    assert 400 <= resp.status_code < 500 and "master_port" in resp.text
