"""What a run checks of the servers it attaches to (runtime/attach.py), from a user trial:
a server busy in a stray join, and one server listed under two host spellings, both
passed every check and failed the run after its trainer had loaded (409 on the join).

The servers are fakes answering the GETs the check makes as ``tandem serve`` does."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from experiments.cli import main
from runtime.attach import check_attached
from runtime.errors import StartRefused


def _flat(text: str) -> str:
    return " ".join(text.split())


def _serve(health: dict) -> ThreadingHTTPServer:
    """A server whose ``/health`` answers ``health``; ``/init_process_group`` (a POST
    route) 405 to a GET, and every other route 404 (no params to compare)."""

    class Server(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the handler's name is http.server's
            status, body = 404, b""
            if self.path == "/health":
                status, body = 200, json.dumps(health).encode()
            elif self.path == "/init_process_group":
                status = 405
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


FREE = {"status": "ok", "pid": 4242, "owner": None, "free_in_s": 0.0, "joining": None}


@pytest.fixture
def servers() -> Iterator[list[ThreadingHTTPServer]]:
    """Two servers, ``a`` and ``b``; a third, busy in a join no run of ours sent."""
    stray = {"rank": 1, "world_size": 2, "owner": None, "ends_in_s": 104.2}
    made = [
        _serve({**FREE, "server_id": "a" * 16}),
        _serve({**FREE, "server_id": "b" * 16, "pid": 4343}),
        _serve({**FREE, "server_id": "c" * 16, "joining": stray}),
    ]
    yield made
    for server in made:
        server.shutdown()
        server.server_close()


def _port(server: ThreadingHTTPServer) -> int:
    return server.server_address[1]


def test_a_server_busy_in_a_join_is_refused_at_once_naming_the_join_and_when_it_ends(servers):
    a, _, busy = (f"http://127.0.0.1:{_port(s)}" for s in servers)
    check_attached([a], "t", owner="run")
    with pytest.raises(StartRefused) as err:
        check_attached([a, busy], "t", owner="run")
    assert str(err.value) == (
        f"live.server_urls[1] {busy} is busy joining a weight group (rank 1 of 2, for "
        "a caller that gave no owner; a stray or aborted /init_process_group blocks the "
        "server until it ends): it is free again within 104 s; wait for it or give this run "
        "another server"
    )


def test_one_server_under_two_host_spellings_is_refused_as_a_url_listed_twice(
    servers, tmp_path, capsys
):
    """Refused as the spec refuses one URL written twice (exit 2, naming the key), before
    anything starts or is written; two servers with their own ids pass."""
    a, b = _port(servers[0]), _port(servers[1])
    check_attached([f"http://127.0.0.1:{a}", f"http://127.0.0.1:{b}"], "t", owner="run")
    urls = f"[http://127.0.0.1:{a},http://localhost:{a}]"
    out = tmp_path / "run"
    argv = ["--set", f"live.server_urls={urls}", "--set", "run.iterations=1", "--out", str(out)]
    assert main(["run", "live-tiny", "--live", *argv]) == 2
    said = _flat(capsys.readouterr().out)
    assert (
        f"spec error: live.server_urls: server_urls[1] http://localhost:{a} is server_urls[0] "
        f"http://127.0.0.1:{a} again (both answer as server {'a' * 16}, pid 4242): a server joins a run's weight "
        "group once; list each server once"
    ) in said, said
    assert not out.exists()
