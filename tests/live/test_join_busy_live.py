"""A user trial on ``tandem serve``, on the shared real server: a stray join (its master
never answers) blocked the server while /health said ok, so an attaching run loaded its
trainer and then failed on a 409; and the server listed as ``127.0.0.1`` and
``localhost`` passed every check of the run and failed it the same way."""

from __future__ import annotations

import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest

from runtime.attach import ServerListedTwice, check_attached
from runtime.errors import StartRefused
from runtime.procs import free_port
from runtime.weight_sync import WeightSender

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
    assert (  # within its connect deadline (5 s: at most timeout_s), not gloo's two tries
        f"MasterUnreachable: the weight group's master 127.0.0.1:{stray['master_port']} "
        "accepted no connection within 5 s" in answers[0].json()["error"]["message"]
    )
    port = urlsplit(server).port
    with pytest.raises(ServerListedTwice, match=r"server_urls\[1\] http://localhost:\d+ is "):
        check_attached([server, f"http://localhost:{port}"], token, owner="run")


def test_a_stray_join_at_the_default_timeout_frees_the_server_in_seconds(server, token):
    """Before: a join whose master never listens held the server 83 s at the default
    timeout_s (60); now it ends at TANDEM_JOIN_CONNECT_S (10 s), and a trainer's join
    right after works."""
    auth = {"Authorization": f"Bearer {token}"}
    stray = {"master_addr": "127.0.0.1", "master_port": free_port(), "rank": 1,
             "world_size": 2, "owner": "stray"}  # fmt: skip
    start = time.monotonic()
    failed = httpx.post(server + "/init_process_group", json=stray, headers=auth, timeout=60)
    waited_s = time.monotonic() - start
    assert failed.status_code == 504, failed.text
    assert "accepted no connection within 10 s" in failed.json()["error"]["message"]
    print(f"stray join at timeout_s 60 answered 504 after {waited_s:.1f} s")
    health = httpx.get(server + "/health", timeout=10).json()
    assert (health["joining"], health["status"]) == (None, "ok")
    port, sender = free_port(), WeightSender()
    sender.listen("127.0.0.1", port, 2, 30.0)
    body = {"master_addr": "127.0.0.1", "master_port": port, "rank": 1, "world_size": 2,
            "timeout_s": 30}  # fmt: skip
    joined: list[httpx.Response] = []
    post = threading.Thread(
        target=lambda: joined.append(
            httpx.post(server + "/init_process_group", json=body, headers=auth, timeout=60)
        )
    )
    post.start()
    sender.join("127.0.0.1", port, 2, "gloo", 30.0)
    post.join()
    assert joined[0].status_code == 200, joined[0].text
