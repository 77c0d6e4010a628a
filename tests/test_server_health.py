"""A server's weight-group joins and what its /health says (runtime/control.py, supervisor.py)."""

from __future__ import annotations

import asyncio

import pytest

from runtime.control import ServerControl, UpdateRejected


class _Engine:
    """An engine whose worker takes ``tandem_join`` until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.calls: list[tuple] = []

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
