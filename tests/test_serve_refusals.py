"""What a user's probes of ``tandem serve`` found (docs/reliability.md, "Probes against
``tandem serve``"): the run lease held without a token, join input answered 504 instead of
a 400 naming its field, error bodies without ``param``, a refused update recorded as a pause.

The routes run in a FastAPI app with the guard in front and an engine whose worker answers
from a script (no vLLM)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import ValidationError

from runtime.control import ServerControl
from runtime.guard import Guard, GuardPolicy
from runtime.lease import RunLease
from runtime.route_errors import install_route_errors
from runtime.server import InitGroupBody, control_router
from runtime.weight_sync import WeightReceiver

TOKEN = {"Authorization": "Bearer secret"}
GLOO_REFUSED = "RuntimeError: The client socket has timed out after 3000ms while trying to connect"
JOIN = {"master_addr": "127.0.0.1", "master_port": 18399, "rank": 1, "world_size": 2}
UPDATE = {
    "version": 1,
    "params": [{"name": "w", "shape": [2], "dtype": "float32"}],
    "buckets": [{"dtype": "float32", "num_tensors": 1, "num_bytes": 8, "blake2b": "0" * 32}],
}


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Engine:
    """A CPU engine whose worker answers each call with the next of ``answers``; generation
    fails each sample (no renderer), which still answers the route with 200."""

    # vLLM's CPU engine: one step at a time (updates load unpaused), on the cpu device
    vllm_config = SimpleNamespace(
        max_concurrent_batches=1, device_config=SimpleNamespace(device_type="cpu")
    )

    def __init__(self, *answers) -> None:
        self.answers = list(answers)
        self.methods: list[str] = []

    def get_tokenizer(self) -> None:
        return None

    async def collective_rpc(self, method: str, timeout: float, args: tuple) -> list:
        self.methods.append(method)
        return self.answers.pop(0)


def _client(engine: _Engine, lease: RunLease | None = None) -> TestClient:
    control = ServerControl(engine, {"w": ((2,), "float32")})
    app = FastAPI()
    app.include_router(control_router(control, lease or RunLease()))
    install_route_errors(app)  # as runtime.server.mount_contract does
    app.add_middleware(Guard, policy=GuardPolicy(token="secret"))
    return TestClient(app)


def _error(resp) -> dict:
    return resp.json()["error"]


def test_generation_without_a_token_does_not_renew_the_lease():
    """Before: every /v1/tandem/generate (an inference route, open without a token)
    renewed the lease, so any client kept a dead run's hold on the server for ever."""
    clock = Clock()
    lease = RunLease(lease_s=300.0, clock=clock)
    with _client(_Engine([{}]), lease) as client:
        joined = client.post("/init_process_group", json={**JOIN, "owner": "run-a"}, headers=TOKEN)
        assert joined.status_code == 200, joined.text
        clock.now += 250
        generated = client.post(
            "/v1/tandem/generate", json={"samples": [{"prompt": "N:3=", "max_tokens": 4}]}
        )
        assert generated.status_code == 200, generated.text
        health = client.get("/health").json()
    assert (health["owner"], health["free_in_s"]) == ("run-a", 50.0)


def test_a_join_that_fails_does_not_claim_the_lease():
    """Before: a join whose trainer never came (504) claimed the lease for 300 s, and the
    run that then attached was refused "serves another run (owner ghost; ...)"."""
    engine = _Engine([{"failure": GLOO_REFUSED}], [{}])
    with _client(engine) as client:
        failed = client.post("/init_process_group", json={**JOIN, "owner": "ghost"}, headers=TOKEN)
        assert failed.status_code == 504, failed.text
        health = client.get("/health").json()
        assert (health["owner"], health["free_in_s"]) == (None, 0.0)
        joined = client.post("/init_process_group", json={**JOIN, "owner": "run"}, headers=TOKEN)
        assert joined.status_code == 200, joined.text
        assert client.get("/health").json()["owner"] == "run"


@pytest.mark.parametrize("world_size", [10**20, 10**18, 65_537])
def test_a_weight_group_of_absurd_size_is_refused_naming_world_size(world_size):
    """Before: world_size 10**20 reached the worker: 504 "can't serialize ints ..."."""
    with pytest.raises(ValidationError, match="world_size"):
        InitGroupBody(**{**JOIN, "world_size": world_size})
    assert InitGroupBody(**{**JOIN, "world_size": 65_536}).world_size == 65_536


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("backend", "nccl", "'nccl' cannot run on this server's cpu device: use 'gloo'"),
        ("master_addr", "no such host!!", "'no such host!!' does not resolve"),
    ],
)
def test_a_join_that_cannot_work_is_a_400_naming_its_field_and_the_server_stays_usable(
    field, value, said
):
    """Before: backend nccl on a CPU server and an unresolvable master_addr reached the
    worker and failed there after 8.4 / 8.7 s (504)."""
    engine = _Engine([{}])
    with _client(engine) as client:
        resp = client.post("/init_process_group", json={**JOIN, field: value}, headers=TOKEN)
        assert resp.status_code == 400, resp.text
        assert _error(resp)["message"].startswith(f"{field}: {said}")
        assert _error(resp)["param"] == f"body.{field}"
        assert engine.methods == []  # refused before the worker
        assert client.get("/health").json()["status"] == "ok"
        assert client.post("/init_process_group", json=JOIN, headers=TOKEN).status_code == 200


def test_tandems_own_refusals_name_their_field_in_param():
    """Before: vLLM's validation errors filled ``param``, tandem's own checks left it null."""
    with _client(_Engine()) as client:
        rank = client.post("/init_process_group", json={**JOIN, "rank": 2}, headers=TOKEN)
        bad = {**UPDATE, "params": [{"name": "w", "shape": [3], "dtype": "float32"}]}
        shape = client.post("/request_weight_update", json=bad, headers=TOKEN)
    assert (rank.status_code, _error(rank)["param"]) == (400, "body.rank")
    assert (shape.status_code, _error(shape)["param"]) == (400, "body.params.0.shape")
    assert _error(shape)["message"] == "params[0].shape: [3] != [2]"


def test_an_update_before_any_join_names_no_field_and_records_no_pause():
    """Before: 409 "version: no weight group ..." named ``version``, not at fault, and
    /health's last_pause_s went from null to 0.0012 while num_updates stayed 0."""
    no_group = WeightReceiver().tandem_receive([("w", (2,), "float32")], UPDATE["buckets"], 1.0)
    with _client(_Engine([no_group])) as client:  # the worker's own answer
        resp = client.post("/request_weight_update", json=UPDATE, headers=TOKEN)
        health = client.get("/health").json()
    assert resp.status_code == 409, resp.text
    assert _error(resp)["message"] == "no weight group: call /init_process_group first"
    assert _error(resp)["param"] is None
    assert (health["num_updates"], health["last_pause_s"]) == (0, None)


def test_renew_takes_the_token_and_the_holders_owner_and_refuses_another_naming_the_holder():
    """POST /renew (runtime.lease_keeper): before, only joins and updates renewed the lease,
    so a run pushing rarer than TANDEM_LEASE_S lost its server to another run's join."""
    clock = Clock()
    lease = RunLease(lease_s=300.0, clock=clock)
    with _client(_Engine([{}]), lease) as client:
        client.post("/init_process_group", json={**JOIN, "owner": "run-a"}, headers=TOKEN)
        clock.now += 250
        assert client.post("/renew", json={"owner": "run-a"}).status_code == 401  # no token
        other = client.post("/renew", json={"owner": "run-b"}, headers=TOKEN)
        assert other.status_code == 409 and _error(other)["param"] == "body.owner"
        assert (
            "owner run-b does not hold this server (owner run-a does)" in _error(other)["message"]
        )
        assert client.get("/health").json()["free_in_s"] == 50.0  # neither renewed it
        renewed = client.post("/renew", json={"owner": "run-a"}, headers=TOKEN)
        assert renewed.json() == {"owner": "run-a", "lease_s": 300.0}
        assert client.get("/health").json()["free_in_s"] == 300.0


def test_a_run_keeps_its_lease_across_a_silence_longer_than_the_lease():
    """The real route and guard on the real clock, a lease of 0.6 s: the run joins, then
    pushes nothing for 1.5 s while its keeper renews; another run's join is still refused.
    Without the keeper the same silence frees the server."""
    import asyncio

    import httpx

    from runtime.lease_keeper import keep_leases

    async def silence(keep: bool) -> int:
        client = _client(_Engine([{}], [{}]), RunLease(lease_s=0.6))
        app = client.app
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://server"
        ) as http:
            joined = await http.post(
                "/init_process_group", json={**JOIN, "owner": "run-a"}, headers=TOKEN
            )
            assert joined.status_code == 200, joined.text
            urls = lambda: ["http://server"]  # noqa: E731
            keeper = (
                asyncio.create_task(keep_leases(urls, "secret", "run-a", http)) if keep else None
            )
            await asyncio.sleep(1.5)
            if keeper is not None:
                keeper.cancel()
            other = await http.post(
                "/init_process_group", json={**JOIN, "owner": "run-b"}, headers=TOKEN
            )
            return other.status_code

    assert asyncio.run(silence(keep=True)) == 409  # held: the other run is refused
    assert asyncio.run(silence(keep=False)) == 200  # lapsed: the other run joined


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        ({k: v for k, v in JOIN.items() if k != "master_addr"}, "master_addr: field required",
         "body.master_addr"),
        ({**JOIN, "rank": 0, "extra": 1},
         "rank: input should be greater than or equal to 1; extra: extra inputs are not permitted",
         "body.rank"),
        (None, "body: field required", "body"),
    ],
)  # fmt: skip
def test_a_body_the_route_refuses_is_a_400_of_one_readable_line_per_field(body, message, param):
    """Before: each error's Python repr (``{'type': 'missing', 'loc': 'body.master_addr',
    …}``) under vLLM's handler; 422 and a list of them under FastAPI's."""
    with _client(_Engine()) as client:
        resp = client.post("/init_process_group", json=body, headers=TOKEN)
    assert resp.status_code == 400, resp.text
    assert _error(resp) == {"message": message, "type": "Bad Request", "param": param, "code": 400}


def test_routes_not_tandems_keep_the_apps_own_validation_answer():
    """vLLM's routes keep vLLM's handler (its own ``param`` rules)."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    from runtime.server import InitGroupBody as Body

    app = FastAPI()

    async def theirs(request, err) -> JSONResponse:
        return JSONResponse({"theirs": True}, status_code=400)

    app.add_exception_handler(RequestValidationError, theirs)

    @app.post("/v1/completions")
    async def complete(body: Body) -> dict:
        return {}

    install_route_errors(app, {"/init_process_group"})
    with TestClient(app) as client:
        assert client.post("/v1/completions", json={}).json() == {"theirs": True}
