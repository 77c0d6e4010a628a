"""A real server whose engine stops stepping says so on /health, and recovers with it; a\nrun counts such a server as lost without waiting for its stream to time out."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pandas as pd
import pytest

from policies.spec import load_spec
from runtime.host_cpu import descendants
from runtime.launcher import run_live
from runtime.procs import free_port, split_cores, start_server, stop_server, wait_healthy

pytestmark = pytest.mark.live

CONFIG = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "live-tiny.yaml"
STEPS, BATCH = 6, 16


def _engine_core(server_pid: int) -> int:
    for pid in descendants(server_pid):
        try:
            if b"EngineCore" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    raise AssertionError(f"no engine-core process below {server_pid}")


@pytest.fixture(scope="module")
def stalling_server(model_dir, token, tmp_path_factory):
    """A server that calls its engine stalled after 2 s without a step."""
    log_dir = Path(tmp_path_factory.mktemp("stalling-server"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TANDEM_STALL_S", "2")
        server = start_server(
            1, model_dir, "127.0.0.1", free_port(), token, split_cores(1)[0], 1.0, 512, 64,
            log_dir,
        )  # fmt: skip
    try:
        wait_healthy(server, timeout_s=float(os.environ.get("TANDEM_SERVER_TIMEOUT_S", "400")))
        yield server
    finally:
        stop_server(server)


def test_a_server_whose_engine_stops_stepping_says_stalled_then_recovers(stalling_server):
    """Before: with its engine core stopped (SIGSTOP), as with an engine hung in a
    collective, the server answered /health 200 "ok" for as long as it lasted, and a run
    went on sending it work."""
    url, engine = stalling_server.base_url, _engine_core(stalling_server.proc.pid)
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


@pytest.mark.timeout(600)
def test_a_run_counts_a_server_whose_engine_hangs_as_lost_by_its_health(
    server, token, stalling_server, tmp_path
):
    """Before: a run whose server's engine hung (SIGSTOP) waited for that server's stream
    to time out (120 s) although its /health said stalled; now the actor asks /health of
    the servers holding its requests every few seconds."""
    out = tmp_path / "run"
    spec = load_spec(
        CONFIG,
        ["pipeline.mode=stream-async", f"run.iterations={STEPS}", f"algorithm.batch_size={BATCH}",
         f"live.server_urls=[{server},{stalling_server.base_url}]", f"live.token={token}"],
    )  # fmt: skip
    engine = _engine_core(stalling_server.proc.pid)
    stopped: list[float] = []

    async def after_step(step: int) -> None:
        if step == 1:
            os.kill(engine, signal.SIGSTOP)
            stopped.append(time.monotonic())

    try:
        run_live(spec, out, after_step=after_step)
        finished = time.monotonic()
    finally:
        os.kill(engine, signal.SIGCONT)
    faults = json.loads((out / "faults.json").read_text())
    assert [(f["event"], f["instance_id"]) for f in faults] == [("lost", 1)], faults
    assert "answers /health 503" in faults[0]["detail"], faults[0]
    # the stream's read timeout alone would have taken 120 s; a push that met the stopped
    # engine fails after 30 s
    assert finished - stopped[0] < 90, f"the run ended {finished - stopped[0]:.0f} s after the stop"
    print(f"the run ended {finished - stopped[0]:.1f} s after the stop")
    samples = pd.read_parquet(out / "samples.parquet")
    assert sorted(samples["sample_id"]) == list(range(STEPS * BATCH))  # none lost, none twice
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["num_servers_lost"] == 1 and metrics["num_samples_trained"] == STEPS * BATCH
