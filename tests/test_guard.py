"""The server's front door without vLLM: tokens, API key and body caps before parsing."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel
from starlette.middleware import Middleware

from runtime.guard import Guard, GuardPolicy, RouteClass


class _Body(BaseModel):
    data: list[int]


def _app(policy: GuardPolicy, parsed: list[str]) -> FastAPI:
    app = FastAPI(middleware=[Middleware(Guard, policy=policy)])

    @app.post("/request_weight_update")
    async def update(body: _Body) -> dict:
        parsed.append("update")
        return {"n": len(body.data)}

    @app.post("/v1/completions")
    async def complete(body: _Body) -> dict:
        parsed.append("complete")
        return {"n": len(body.data)}

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.post("/scale_elastic_ep")
    async def scale() -> dict:
        return {"scaled": True}

    return app


def _call(app, method: str, path: str, **kw) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.request(method, path, **kw)

    return asyncio.run(go())


def test_route_classes_default_to_control():
    policy = GuardPolicy(token="t")
    assert policy.route_class("/health") == RouteClass.PUBLIC
    assert policy.route_class("/v1/tandem/generate") == RouteClass.INFERENCE
    assert policy.route_class("/request_weight_update") == RouteClass.CONTROL
    assert policy.route_class("/scale_elastic_ep") == RouteClass.CONTROL  # vLLM's, not open


@pytest.mark.parametrize(("header", "status"), [(None, 401), ("Bearer nope", 403)])
def test_control_routes_refuse_before_reading_a_large_body(header, status):
    parsed: list[str] = []
    app = _app(GuardPolicy(token="secret", max_control_body_bytes=1024), parsed)
    headers = {"Authorization": header} if header else {}
    big = {"data": list(range(200_000))}  # ~1.3 MB of JSON
    resp = _call(app, "POST", "/request_weight_update", json=big, headers=headers)
    assert resp.status_code == status and parsed == []
    assert _call(app, "POST", "/scale_elastic_ep", headers=headers).status_code == status


def test_bodies_over_the_cap_are_refused_with_413_even_with_the_token():
    parsed: list[str] = []
    app = _app(GuardPolicy(token="secret", max_control_body_bytes=1024), parsed)
    auth = {"Authorization": "Bearer secret"}
    resp = _call(app, "POST", "/request_weight_update", json={"data": [1] * 5000}, headers=auth)
    assert resp.status_code == 413 and "1024" in resp.text and parsed == []

    async def chunks():  # no Content-Length: counted as it arrives
        for _ in range(10):
            yield b" " * 512

    resp = _call(app, "POST", "/request_weight_update", content=chunks(), headers=auth)
    assert resp.status_code == 413 and parsed == []
    ok = _call(app, "POST", "/request_weight_update", json={"data": [1, 2]}, headers=auth)
    assert ok.status_code == 200 and parsed == ["update"]


def test_the_api_key_guards_inference_routes_only_when_set():
    parsed: list[str] = []
    open_app = _app(GuardPolicy(token="secret"), parsed)
    assert _call(open_app, "POST", "/v1/completions", json={"data": []}).status_code == 200
    keyed = _app(GuardPolicy(token="secret", api_key="k"), parsed)
    assert _call(keyed, "POST", "/v1/completions", json={"data": []}).status_code == 401
    wrong = {"Authorization": "Bearer secret"}  # the control token is not the API key
    assert (
        _call(keyed, "POST", "/v1/completions", json={"data": []}, headers=wrong).status_code == 403
    )
    right = {"Authorization": "Bearer k"}
    assert (
        _call(keyed, "POST", "/v1/completions", json={"data": []}, headers=right).status_code == 200
    )
    assert _call(keyed, "GET", "/health").status_code == 200  # probes stay open


def test_an_insecure_server_leaves_control_routes_open():
    app = _app(GuardPolicy(token=None, insecure_no_token=True), [])
    assert _call(app, "POST", "/request_weight_update", json={"data": []}).status_code == 200


@pytest.mark.parametrize("header", ["Basic secret", "secret", "Token secret"])
def test_a_credential_of_another_scheme_is_a_401_saying_bearer_is_expected(header):
    """Before: ``Authorization: Basic SECRET`` got 403 "wrong bearer token", as if the
    token were wrong; the answer never echoes what the header held."""
    app = _app(GuardPolicy(token="secret"), [])
    resp = _call(app, "POST", "/scale_elastic_ep", headers={"Authorization": header})
    assert resp.status_code == 401
    assert resp.json() == {"detail": "Authorization: Bearer <token> expected, not another scheme"}
    assert resp.headers["www-authenticate"] == "Bearer"


def test_the_bearer_scheme_is_case_insensitive():
    app = _app(GuardPolicy(token="secret"), [])
    resp = _call(app, "POST", "/scale_elastic_ep", headers={"Authorization": "bearer secret"})
    assert resp.status_code == 200
