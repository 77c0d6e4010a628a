"""Servers tandem starts let an idle engine sleep (runtime/vllm_plugin.py).

vLLM's engine processes busy-wait for a second after each message they exchange; on this
CPU host that second is taken from the trainer or from another server's engine."""

from __future__ import annotations

import os
import time

import httpx
import psutil
import pytest

from runtime.tasks import TaskSet

pytestmark = pytest.mark.live


def _cpu_s(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        times = p.cpu_times()
        total += times.user + times.system
    return total


def _idle(base_url: str) -> bool:
    """No request running or waiting (another test may have left one decoding)."""
    text = httpx.get(base_url + "/metrics", timeout=10).text
    counts = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting"))
    ]
    return bool(counts) and not any(counts)


def test_idle_engine_processes_use_no_cpu_right_after_a_request(server_process):
    engine = psutil.Process(server_process.proc.pid).children(recursive=True)
    assert engine, "the server started no engine processes"
    deadline = time.monotonic() + 120
    while not _idle(server_process.base_url):
        assert time.monotonic() < deadline, "the server never became idle"
        time.sleep(0.2)
    body = {"model": "tandem", "prompt": TaskSet(0, 1, 64)[0].text, "max_tokens": 8,
            "temperature": 1.0}  # fmt: skip
    httpx.post(
        server_process.base_url + "/v1/completions", json=body, timeout=120
    ).raise_for_status()
    time.sleep(0.1)
    before = _cpu_s(engine)
    time.sleep(0.8)  # inside vLLM's own 1 s spin after the last message
    used = _cpu_s(engine) - before
    # with vLLM's 1 s spin the model worker alone burns ~0.8 s of CPU here
    assert used < 0.25, f"engine processes used {used:.2f} s of CPU in 0.8 s idle"


def test_server_is_its_own_process_group_in_the_launchers_session(server_process):
    """Own group: stop_server signals it whole; same session: Linux's autogroup would
    otherwise schedule each server as a group of its own, and two servers' engines on one
    core took turns of up to a second (docs/live-throughput.md)."""
    pid = server_process.proc.pid
    assert os.getpgid(pid) == pid
    assert os.getsid(pid) == os.getsid(0)


def test_model_runs_inside_the_engine_core_process(server_process):
    """The default "uni" executor: no worker process of its own, so no shared-memory queue
    between scheduler and model (runtime/server.py EXECUTORS)."""
    names = [p.name() for p in psutil.Process(server_process.proc.pid).children(recursive=True)]
    assert sum(n.startswith("VLLM::EngineCore") for n in names) == 1, names
    assert not [n for n in names if n.startswith("VLLM::Worker")], names
