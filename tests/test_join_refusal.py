"""The weight group's join ends at the first server that refuses it (runtime.fan_out):
before, the trainer waited out the 60 s rendezvous and then raised a traceback."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from runtime.errors import LiveRunError
from runtime.fan_out import ServerAddr, fan_out, join_unless_refused

ROUTE = "/init_process_group"


def _server(status: int, delay_s: float = 0.0) -> ThreadingHTTPServer:
    class Answer(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the handler's name is http.server's
            self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(delay_s)
            body = json.dumps({"detail": "this server serves another run"}).encode()
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _join(servers: list[ThreadingHTTPServer], work) -> float:
    addrs = [ServerAddr(f"http://127.0.0.1:{s.server_address[1]}", "t") for s in servers]
    start = time.monotonic()
    with httpx.Client() as http:
        threads, out = fan_out(http, addrs, ROUTE, [{}] * len(addrs), 30)
        join_unless_refused(work, threads, out, ROUTE)
    return time.monotonic() - start


def test_a_server_that_refuses_to_join_ends_the_wait_at_once_naming_it():
    ok, refusing = _server(200), _server(409)
    try:
        with pytest.raises(
            LiveRunError, match=r"generation server 1 did not join the weight group: .*409"
        ):
            _join([ok, refusing], lambda: time.sleep(30))  # a rendezvous never completed
        assert _join([ok, ok], lambda: None) < 5  # every server joined: no error
    finally:
        for s in (ok, refusing):
            s.shutdown()


def test_a_failed_rendezvous_names_the_server_that_said_why_else_raises_its_own_error():
    ok, failing = _server(200), _server(504)

    def times_out() -> None:
        time.sleep(0.5)  # the servers answer first: a 504 names its server
        raise TimeoutError("wait timeout after 60000ms")

    try:
        with pytest.raises(LiveRunError, match="generation server 0 did not join.*504"):
            _join([failing], times_out)
        with pytest.raises(TimeoutError, match="wait timeout"):
            _join([ok], times_out)
    finally:
        for s in (ok, failing):
            s.shutdown()


def test_a_join_that_failed_waiting_names_the_server_that_never_answered_too():
    """Seen live: server 1's engine stopped; server 0 waited 60 s in the group for it and
    answered 504, and the run's error named server 0 only."""
    failing, silent = _server(504), _server(200, delay_s=5)
    try:
        with pytest.raises(
            LiveRunError,
            match=r"server 0 did not join.*504.*generation server 1 has not answered "
            r"/init_process_group",
        ):
            _join([failing, silent], lambda: time.sleep(30))
    finally:
        for s in (failing, silent):
            s.shutdown()
