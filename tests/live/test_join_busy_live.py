"""A user trial on ``tandem serve``, on the shared real server: a stray join (its master
never answers) blocked the server while /health said ok, so an attaching run loaded its
trainer and then failed on a 409; and the server listed as ``127.0.0.1`` and
``localhost`` passed every check of the run and failed it the same way."""

from __future__ import annotations

import threading
from urllib.parse import urlsplit

import httpx
import pytest

from runtime.attach import ServerListedTwice, check_attached
from runtime.errors import StartRefused
from runtime.procs import free_port

pytestmark = pytest.mark.live


def _joining(server: str) -> dict | None:
    return httpx.get(server + "/health", timeout=10).json()["joining"]


def test_a_stray_join_is_on_health_and_refuses_a_run_and_one_server_listed_twice(server, token):
    auth = {"Authorization": f"Bearer {token}"}
    stray = {"master_addr": "127.0.0.1", "master_port": free_port(), "rank": 1,
             "world_size": 2, "timeout_s": 5, "owner": "stray"}  # fmt: skip
    answers: list[httpx.Response] = []
    thread = threading.Thread(
        target=lambda: answers.append(
            httpx.post(server + "/init_process_group", json=stray, headers=auth, timeout=120)
        )
    )
    thread.start()
    seen = None
    while seen is None and thread.is_alive():  # until the server has taken the join
        seen = _joining(server)
    assert seen is not None, answers
    assert {k: seen[k] for k in ("rank", "world_size", "owner")} == {
        "rank": 1, "world_size": 2, "owner": "stray",
    }  # fmt: skip
    second = httpx.post(server + "/init_process_group", json={**stray, "owner": "run"},
                        headers=auth, timeout=30)  # fmt: skip
    assert second.status_code == 409, second.text
    assert (
        "busy joining a weight group as rank 1 of 2 for owner stray, ending within"
        in second.json()["error"]["message"]
    )
    with pytest.raises(StartRefused, match=r"is busy joining a weight group \(rank 1 of 2, for "):
        check_attached([server], token, owner="run")
    thread.join()
    assert answers[0].status_code == 504 and _joining(server) is None  # free again
    port = urlsplit(server).port
    with pytest.raises(ServerListedTwice, match=r"server_urls\[1\] http://localhost:\d+ is "):
        check_attached([server, f"http://localhost:{port}"], token, owner="run")
