"""A real server whose engine stops stepping says so on /health, and recovers with it."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from runtime.host_cpu import descendants
from runtime.procs import free_port, split_cores, start_server, stop_server, wait_healthy

pytestmark = pytest.mark.live


def _engine_core(server_pid: int) -> int:
    for pid in descendants(server_pid):
        try:
            if b"EngineCore" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    raise AssertionError(f"no engine-core process below {server_pid}")


def test_a_server_whose_engine_stops_stepping_says_stalled_then_recovers(
    model_dir, tmp_path, monkeypatch
):
    """Before: with its engine core stopped (SIGSTOP), as with an engine hung in a
    collective, the server answered /health 200 "ok" for as long as it lasted, and a run
    went on sending it work."""
    monkeypatch.setenv("TANDEM_STALL_S", "2")
    server = start_server(
        0, model_dir, "127.0.0.1", free_port(), "t", split_cores(1)[0], 1.0, 512, 64, tmp_path
    )
    try:
        wait_healthy(server, timeout_s=float(os.environ.get("TANDEM_SERVER_TIMEOUT_S", "400")))
        url, engine = server.base_url, _engine_core(server.proc.pid)
        body = {"model": "tandem", "prompt": "R4:abc=", "max_tokens": 8}
        answer: dict = {}
        os.kill(engine, signal.SIGSTOP)
        try:
            asking = threading.Thread(
                target=lambda: answer.update(
                    r=httpx.post(url + "/v1/completions", json=body, timeout=120)
                )  # fmt: skip
            )
            asking.start()
            deadline, health = time.monotonic() + 30, httpx.get(url + "/health", timeout=5)
            while health.status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.5)
                health = httpx.get(url + "/health", timeout=5)
            assert health.status_code == 503, health.text
            assert health.json()["status"] == "stalled" and health.json()["stalled_s"] >= 2
        finally:
            os.kill(engine, signal.SIGCONT)
        asking.join(timeout=60)
        assert answer["r"].status_code == 200  # the request held finishes once it steps
        assert httpx.get(url + "/health", timeout=5).json()["status"] == "ok"
    finally:
        stop_server(server)
