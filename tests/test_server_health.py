"""A server's weight-group joins and what its /health says (runtime/control.py, supervisor.py)."""

from __future__ import annotations

import asyncio
import re

import pytest

from runtime.control import ServerControl, UpdateRejected


class _Engine:
    """An engine whose worker takes ``tandem_join`` until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.calls: list[tuple] = []

    def get_tokenizer(self) -> None:
        return None

    async def collective_rpc(self, method: str, timeout: float, args: tuple) -> list:
        self.calls.append((method, args))
        await self.release.wait()
        return [True]


def test_a_second_join_while_one_is_under_way_is_refused_not_queued():
    """Before: the second join (a server listed twice) queued behind the first, which then
    waited 60 s for it and failed; the engine hung in the second's set-up for good."""

    async def scenario() -> None:
        engine = _Engine()
        control = ServerControl(engine, {})
        first = asyncio.create_task(control.join_group("127.0.0.1", 1, 1, 3, "gloo", 60.0))
        await asyncio.sleep(0)
        with pytest.raises(UpdateRejected, match="joining a weight group as rank 1") as err:
            await asyncio.wait_for(control.join_group("127.0.0.1", 1, 2, 3, "gloo", 60.0), 5)
        assert err.value.status == 409
        engine.release.set()
        await first
        await control.join_group("127.0.0.1", 2, 1, 2, "gloo", 60.0)  # a later join: taken
        assert [c[1][2] for c in engine.calls] == [1, 1]  # the refused one never reached it

    asyncio.run(scenario())


class _Processor:
    def process_outputs(self, *args, **kwargs):
        return None

    def get_num_unfinished_requests(self) -> int:
        return 1  # a request held throughout


def test_an_engine_busy_in_a_join_is_not_stalled_until_past_the_joins_own_time(monkeypatch):
    """Seen live: an engine stopped mid-run hung its server's weight update (the pause
    never returned), and /health said ok for as long as that lasted."""
    import runtime.control

    monkeypatch.setattr(runtime.control, "BUSY_GRACE_S", 0.0)
    monkeypatch.setattr(runtime.control, "join_limit_s", lambda timeout_s, connect_s: timeout_s)

    async def scenario() -> None:
        engine = _Engine()
        engine.output_processor = _Processor()
        control = ServerControl(engine, {}, stall_s=0.05)
        joining = asyncio.create_task(control.join_group("127.0.0.1", 1, 1, 2, "gloo", 0.3))
        await asyncio.sleep(0.15)
        assert control.stalled_for() is None  # within the join's time: busy, not stalled
        await asyncio.sleep(0.4)
        assert control.stalled_for() is not None  # past it, no step: stalled
        joining.cancel()

    asyncio.run(scenario())


def test_a_lost_server_is_described_by_what_its_health_says():
    """Seen live: a server whose engine had stopped was lost as "stopped answering
    /health", while it answered 503 stalled (its engine held requests without a step)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from runtime.supervisor import Servers, ServerSlot

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the handler's name is http.server's
            body = json.dumps({"status": "stalled", "stalled_s": 101.4}).encode()
            self.send_response(503)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Health) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        servers = Servers([ServerSlot(0, url)], "t")
        said = asyncio.run(servers.confirm_lost(0, "ReadTimeout: "))
        server.shutdown()
    assert said is not None and said.endswith(
        "answers /health 503 stalled: its engine has held requests 101 s without a step "
        "(ReadTimeout: )"
    )


@pytest.mark.parametrize("timeout_s", [1e12, 1e300, float("inf")])
def test_a_join_or_update_timeout_past_a_day_is_refused_naming_it(timeout_s):
    """Before: 1e12 timed out at once (a deadline in the past), 1e300 failed with "Python
    int too large to convert"."""
    from pydantic import ValidationError

    from runtime.server import InitGroupBody, WeightUpdateBody

    join = {"master_addr": "127.0.0.1", "master_port": 1, "rank": 1, "world_size": 2}
    update = {"version": 1, "params": [{"name": "w", "shape": [1], "dtype": "float32"}]}
    for body, fields in ((InitGroupBody, join), (WeightUpdateBody, update)):
        with pytest.raises(ValidationError, match="timeout_s"):
            body(**fields, timeout_s=timeout_s)
        assert body(**fields, timeout_s=86_400).timeout_s == 86_400


GLOO_REFUSED = (
    "RuntimeError: The client socket has timed out after 3000ms while trying to connect to "
    "(127.0.0.1, 18399)."
)


class _Answers:
    """An engine whose worker answers each call at once with the next of ``answers``
    (an exception is raised, as vLLM's engine core reports a worker's error)."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)

    def get_tokenizer(self) -> None:
        return None

    async def collective_rpc(self, method: str, timeout: float, args: tuple) -> list:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_a_join_that_fails_in_the_worker_is_a_504_and_the_server_stays_usable():
    """Before: gloo's own connect timeout ("... has timed out ...") marked the server stuck
    (503 on /health, every later join refused) and said the worker "did not return from
    tandem_join within 8.0 s", though it had returned within 3."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from runtime.lease import RunLease
    from runtime.server import control_router

    engine = _Answers(
        [{"failure": GLOO_REFUSED}],  # a worker that returns why (runtime.weight_sync)
        Exception(f"Call to collective_rpc method failed: {GLOO_REFUSED}"),  # one that raises
        [{}],
    )
    app = FastAPI()
    app.include_router(control_router(ServerControl(engine, {}), RunLease()))
    join = {"master_addr": "127.0.0.1", "master_port": 18399, "rank": 1, "world_size": 2,
            "timeout_s": 3}  # fmt: skip
    with TestClient(app) as client:
        for _ in range(2):
            failed = client.post("/init_process_group", json=join)
            assert failed.status_code == 504, failed.text
            assert failed.json()["detail"].startswith("joining the weight group failed: ")
            assert "client socket has timed out" in failed.json()["detail"]
            assert client.get("/health").json()["status"] == "ok"
        assert client.post("/init_process_group", json=join).json() == {"joined": True, "rank": 1}


def test_only_a_call_that_does_not_return_in_time_marks_the_worker_stuck_saying_how_long():
    class _Hangs:
        async def collective_rpc(self, method: str, timeout: float, args: tuple) -> list:
            await asyncio.sleep(3600)  # the in-process executor has no timeout of its own
            return []

    async def scenario() -> str:
        control = ServerControl(_Hangs(), {})
        with pytest.raises(UpdateRejected) as err:
            await control._rpc("tandem_join", 0.2, ())
        assert err.value.status == 503 and control.condition() == ("stuck", None)
        return control.stuck

    said = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert re.fullmatch(
        r"the model worker did not return from tandem_join within 0\.[23] s \(the call's "
        r"limit: 0\.2 s\)",
        said,
    ), said

    vllm_timeout = Exception("Call to collective_rpc method failed: RPC call to x timed out.")
    control = ServerControl(_Answers(vllm_timeout), {})  # vLLM's multiprocess executor's
    with pytest.raises(UpdateRejected):
        asyncio.run(control._rpc("x", 5.0, ()))
    assert control.condition()[0] == "stuck"


def test_a_join_under_way_is_on_health_with_its_end_and_a_second_join_is_told_when():
    """Seen in a user trial: a stray join (its master never answers) blocked the server
    for 108 s while /health said ok, ``owner`` null, ``free_in_s`` 0, so a run attached,
    loaded its trainer and then failed on a 409 that said "a server joins a run's group
    once". Now /health gives the join under way and when it ends, and the 409 says so."""
    from fastapi import FastAPI
    from httpx import ASGITransport, AsyncClient

    from runtime.control import join_limit_s
    from runtime.lease import RunLease
    from runtime.server import control_router

    engine = _Engine()  # the worker joins until released
    app = FastAPI()
    app.include_router(control_router(ServerControl(engine, {}), RunLease()))
    join = {"master_addr": "127.0.0.1", "master_port": 1, "rank": 1, "world_size": 2,
            "owner": "stray"}  # fmt: skip

    async def scenario() -> None:
        transport = ASGITransport(app=app)
        async with AsyncClient(transport=transport, base_url="http://server") as client:
            first = asyncio.create_task(client.post("/init_process_group", json=join))
            while not engine.calls:
                await asyncio.sleep(0.01)
            health = (await client.get("/health")).json()
            assert health["status"] == "ok" and re.fullmatch("[0-9a-f]{16}", health["server_id"])
            pending = health["joining"]
            assert pending.pop("ends_in_s") == pytest.approx(join_limit_s(60.0, 10.0), abs=30)
            assert pending == {"rank": 1, "world_size": 2, "owner": "stray"}
            second = await client.post("/init_process_group", json={**join, "owner": "run"})
            assert second.status_code == 409
            assert re.search(
                r"busy joining a weight group as rank 1 of 2 for owner stray, ending within "
                r"\d+ s: it takes one join at a time",
                second.json()["detail"],
            ), second.text
            engine.release.set()
            assert (await first).json() == {"joined": True, "rank": 1}
            assert (await client.get("/health")).json()["joining"] is None

    asyncio.run(asyncio.wait_for(scenario(), 30))
