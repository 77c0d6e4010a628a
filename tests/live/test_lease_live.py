"""A run keeps its server's lease through a step longer than the lease (runtime.lease_keeper):
a real server started with ``TANDEM_LEASE_S=2``, a run attached to it that pushes nothing
for 5 s. Before, only joins and weight updates renewed the lease, so it lapsed mid-run and
another run's join could take the server."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest

from policies.spec import load_spec
from runtime.launcher import run_live
from runtime.lease import owner_of
from runtime.procs import free_port, split_cores, start_server, stop_server, wait_healthy

pytestmark = pytest.mark.live

CONFIG = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "live-tiny.yaml"
LEASE_S = 2.0
SILENCE_S = 5.0  # no push, no join: longer than the lease


@pytest.fixture
def short_lease_server(model_dir, token, tmp_path, monkeypatch) -> str:
    monkeypatch.setenv("TANDEM_LEASE_S", str(LEASE_S))  # start_server passes it on
    gen_cores, _ = split_cores(1)
    proc = start_server(
        0, model_dir, "127.0.0.1", free_port(), token, gen_cores, 1.0, 512, 64, tmp_path / "logs"
    )
    try:
        wait_healthy(proc, timeout_s=float(os.environ.get("TANDEM_SERVER_TIMEOUT_S", "400")))
        yield proc.base_url
    finally:
        stop_server(proc)


def test_a_run_keeps_its_lease_through_a_step_longer_than_the_lease(
    short_lease_server, token, tmp_path
):
    url, run_dir = short_lease_server, tmp_path / "run"
    spec = load_spec(CONFIG, [
        "pipeline.mode=disagg-sync", "run.iterations=2", "algorithm.batch_size=16",
        f"live.server_urls=[{url}]", f"live.token={token}",
    ])  # fmt: skip
    seen: list[dict] = []

    async def silent_step(step: int) -> None:
        if step == 0:  # disagg-sync pushes after the step: nothing reaches the server
            await asyncio.sleep(SILENCE_S)
            async with httpx.AsyncClient() as http:
                seen.append((await http.get(url + "/health")).json())

    run_live(spec, run_dir, after_step=silent_step)
    (health,) = seen
    assert health["owner"] == owner_of(run_dir)
    assert health["free_in_s"] > LEASE_S / 3  # renewed within the silence: still held
    assert httpx.get(url + "/health").json()["owner"] is None  # released at the run's end
