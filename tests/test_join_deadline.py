"""A join that cannot succeed is cut short (docs/reliability.md, "A join whose master
never answers frees the server in seconds").

From a user trial: a stray ``/init_process_group`` whose master never answers held the
server's weight-group slot until gloo gave up (``3 × timeout_s + 5`` s, 185 s at the
default 60 s). The worker now reaches the master within ``JOIN_CONNECT_S`` and only then
waits ``timeout_s`` for the group. The worker here is the real :class:`WeightReceiver`
on real gloo, called as vLLM would call it (no vLLM); the waits below are hang guards,
several times what each case takes now (10 s), far below what it took before.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from runtime.control import ServerControl
from runtime.joining import JOIN_CONNECT_ENV, JOIN_CONNECT_S, join_connect_s_from_env
from runtime.lease import RunLease
from runtime.procs import free_port
from runtime.route_errors import install_route_errors
from runtime.server import control_router
from runtime.weight_sync import WeightReceiver, WeightSender

HANG_GUARD_S = 45.0  # each failing join ends within JOIN_CONNECT_S (10 s); before: 83 s, never
REPO = Path(__file__).resolve().parents[1]


class _WorkerEngine:
    """A CPU engine whose one worker is a real WeightReceiver, run off the event loop as
    vLLM's in-process executor runs it."""

    vllm_config = SimpleNamespace(
        max_concurrent_batches=1, device_config=SimpleNamespace(device_type="cpu")
    )

    def __init__(self) -> None:
        self.worker = WeightReceiver()

    def get_tokenizer(self) -> None:
        return None

    async def collective_rpc(self, method: str, timeout: float, args: tuple) -> list:
        return [await asyncio.to_thread(getattr(self.worker, method), *args)]


def _client() -> TestClient:
    app = FastAPI()
    app.include_router(control_router(ServerControl(_WorkerEngine(), {}), RunLease()))
    install_route_errors(app)
    return TestClient(app)


def _in_thread(call) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    return thread, out


def _join_body(port: int, owner: str) -> dict:
    return {"master_addr": "127.0.0.1", "master_port": port, "rank": 1, "world_size": 2,
            "timeout_s": 60, "owner": owner}  # fmt: skip


def _real_join(client: TestClient, owner: str) -> int:
    """A trainer's join (it listens, posts, hosts the group); the route's status."""
    port, sender = free_port(), WeightSender()
    sender.listen("127.0.0.1", port, 2, 30.0)
    posted = threading.Thread(
        target=lambda: sender.join("127.0.0.1", port, 2, "gloo", 30.0), daemon=True
    )
    posted.start()
    status = client.post("/init_process_group", json=_join_body(port, owner)).status_code
    posted.join(HANG_GUARD_S)
    return status


def test_a_join_whose_master_never_listens_is_a_504_within_seconds_and_frees_the_server():
    """Before: 504 "The client socket has timed out ..." after 83 s (timeout_s 60), the
    server refusing every other join meanwhile."""
    port = free_port()  # nothing listens there
    client = _client()  # no ``with``: a join that hangs fails the guard, not the teardown
    thread, out = _in_thread(
        lambda: client.post("/init_process_group", json=_join_body(port, "ghost"))
    )
    assert not thread.is_alive(), f"the join still held the server after {HANG_GUARD_S} s"
    failed = out[0]
    assert failed.status_code == 504, failed.text
    message = failed.json()["error"]["message"]
    assert message.startswith(
        f"joining the weight group failed: MasterUnreachable: the weight group's master "
        f"127.0.0.1:{port} accepted no connection within {JOIN_CONNECT_S:g} s (last try: "
        "ConnectionRefusedError"
    ), message
    health = client.get("/health").json()
    assert (health["joining"], health["owner"], health["free_in_s"]) == (None, None, 0.0)
    assert _real_join(client, "run") == 200  # the server is free: a real join works
    assert client.get("/health").json()["owner"] == "run"


def test_a_master_that_accepts_and_never_answers_fails_the_join_and_the_next_join_works():
    """Before: torch's store client waits for the ping's answer without a timeout: the
    worker never returned, and the server was marked stuck for good after 185 s."""
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never answers
    port = silent.getsockname()[1]
    worker = WeightReceiver()
    try:
        thread, out = _in_thread(
            lambda: worker.tandem_join("127.0.0.1", port, 1, 2, "gloo", 60.0, "127.0.0.1")
        )
        assert not thread.is_alive(), f"the join still held the worker after {HANG_GUARD_S} s"
        assert out[0]["failure"] == (
            f"MasterUnreachable: the weight group's master 127.0.0.1:{port} accepted a "
            "connection but did not answer as the trainer's store (a torch TCPStore) within "
            f"{JOIN_CONNECT_S:g} s"
        )
    finally:
        silent.close()
    _joins_again(worker)


def test_a_trainer_that_dies_after_the_server_reached_its_store_frees_the_worker():
    """The store answered, the server's rank posted its address, then the trainer died
    before building its group: the join fails at once, and a later join works (no thread
    of the failed one holds the worker)."""
    port = free_port()
    trainer = subprocess.Popen(
        [sys.executable, "-c", _DYING_TRAINER.format(repo=str(REPO), port=port)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert trainer.stdout.readline().strip() == "listening"
        worker = WeightReceiver()
        thread, out = _in_thread(
            lambda: worker.tandem_join("127.0.0.1", port, 1, 2, "gloo", 60.0, "127.0.0.1")
        )
        assert not thread.is_alive(), f"the join still held the worker after {HANG_GUARD_S} s"
        assert trainer.wait(10) == 0  # it died once the server's rank had posted
        assert "Failed to recv" in out[0]["failure"], out
    finally:
        trainer.kill()
    _joins_again(worker)


# a trainer that hosts the store and exits once a rank has posted its address into it
_DYING_TRAINER = """
import os, sys, time
from datetime import timedelta
sys.path.insert(0, {repo!r})
from runtime.weight_group import master_store
store = master_store("127.0.0.1", {port}, 2, timedelta(seconds=60))
print("listening", flush=True)
while store.num_keys() < 1:
    time.sleep(0.01)
os._exit(0)
"""


def _join_in_thread(worker: WeightReceiver, port: int, out: list) -> threading.Thread:
    """Rank 1's join on 127.0.0.1:``port``, started in a thread; its answer goes to ``out``."""
    thread = threading.Thread(
        target=lambda: out.append(
            worker.tandem_join("127.0.0.1", port, 1, 2, "gloo", 30.0, "127.0.0.1")
        ),
        daemon=True,
    )
    thread.start()
    return thread


def _joins_again(worker: WeightReceiver) -> None:
    port, sender = free_port(), WeightSender()
    sender.listen("127.0.0.1", port, 2, 30.0)
    out: list = []
    thread = _join_in_thread(worker, port, out)
    sender.join("127.0.0.1", port, 2, "gloo", 30.0)
    thread.join(HANG_GUARD_S)
    assert out == [{}] and worker.tandem_group is not None


def test_a_trainer_that_listens_after_posting_is_still_waited_for():
    """A trainer may post the join before its store listens (the PipelineRL order): the
    worker tries again until the store answers, within JOIN_CONNECT_S."""
    port, worker, sender = free_port(), WeightReceiver(), WeightSender()
    out: list = []
    joining = _join_in_thread(worker, port, out)
    threading.Event().wait(0.5)  # the worker has tried and found nothing listening
    sender.join("127.0.0.1", port, 2, "gloo", 30.0)
    joining.join(HANG_GUARD_S)
    assert out == [{}]


@pytest.mark.parametrize("raw", ["0", "-1", "soon", "1e300"])
def test_the_join_connect_setting_is_positive_seconds(monkeypatch, raw):
    monkeypatch.setenv(JOIN_CONNECT_ENV, raw)
    with pytest.raises(ValueError, match=f"{JOIN_CONNECT_ENV}='{raw}': expected seconds > 0"):
        join_connect_s_from_env()
    monkeypatch.setenv(JOIN_CONNECT_ENV, "2.5")
    assert join_connect_s_from_env() == 2.5
