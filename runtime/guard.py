"""The generation server's front door: who may call which route, and how big a body may be.

:class:`Guard` is ASGI middleware placed outside every route, so its checks run before
any body is read or parsed: a control call without the token is refused at once (401 /
403) whatever it carries, and a body over its route's cap is refused (413) from its
``Content-Length`` or, for a chunked upload, the moment the bytes received pass the cap.

Routes fall in three classes (:meth:`GuardPolicy.route_class`):

* *public* probes (``/health``, ``/metrics``, ``/ping``, ...): open, tiny bodies;
* *inference* (``/v1/...``, ``/tokenize``, ...): open, or the API key when one is set;
* *control*: every other route — ours (``/init_process_group``, ``/request_weight_update``,
  ``/weights/checksums``) and anything else vLLM mounts (``/scale_elastic_ep``, ...):
  the token.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from enum import StrEnum

from starlette.exceptions import HTTPException

MIB = 2**20
PUBLIC_PATHS = frozenset(
    {"/health", "/metrics", "/ping", "/version", "/load", "/openapi.json", "/docs", "/redoc",
     "/docs/oauth2-redirect", "/kv_event_sources"}
)  # fmt: skip
INFERENCE_PATHS = frozenset({"/tokenize", "/detokenize", "/invocations", "/generative_scoring"})


class RouteClass(StrEnum):
    PUBLIC = "public"
    INFERENCE = "inference"
    CONTROL = "control"


@dataclass(slots=True, frozen=True)
class GuardPolicy:
    token: str | None  # bearer token of the control routes (None: open, if insecure_no_token)
    api_key: str | None = None  # bearer key of the inference routes (None: open)
    insecure_no_token: bool = False
    max_control_body_bytes: int = 8 * MIB  # an update's metadata: ~100 bytes per tensor
    max_inference_body_bytes: int = 64 * MIB
    max_public_body_bytes: int = 64 * 1024

    def route_class(self, path: str) -> RouteClass:
        if path in PUBLIC_PATHS:
            return RouteClass.PUBLIC
        if path.startswith("/v1/") or path in INFERENCE_PATHS:
            return RouteClass.INFERENCE
        return RouteClass.CONTROL

    def max_body_bytes(self, kind: RouteClass) -> int:
        return {
            RouteClass.PUBLIC: self.max_public_body_bytes,
            RouteClass.INFERENCE: self.max_inference_body_bytes,
            RouteClass.CONTROL: self.max_control_body_bytes,
        }[kind]

    def refusal(self, kind: RouteClass, authorization: str | None) -> tuple[int, str] | None:
        """(status, reason) when the caller may not use this class of route, else None."""
        secret = {RouteClass.CONTROL: self.token, RouteClass.INFERENCE: self.api_key}.get(kind)
        if secret is None:
            return None
        what = "token" if kind == RouteClass.CONTROL else "API key"
        if authorization is None:
            return 401, f"missing Authorization: Bearer <{what}>"
        scheme, _, credential = authorization.partition(" ")
        if scheme.lower() != "bearer":  # Basic, say: never echoed, it may hold the secret
            return 401, f"Authorization: Bearer <{what}> expected, not another scheme"
        if not secrets.compare_digest(credential.strip().encode(), secret.encode()):
            return 403, f"wrong bearer {what}"
        return None


class _BodyTooLarge(HTTPException):
    """Raised from ``receive``: an HTTPException, so that routes answer it as 413 (FastAPI
    turns any other error while reading a body into a 400)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"body over {limit} bytes, the cap of this route")


class Guard:
    """ASGI middleware: authorisation and body caps before anything reads the body."""

    def __init__(self, app, policy: GuardPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        kind = self.policy.route_class(scope["path"])
        refused = self.policy.refusal(kind, headers.get("authorization"))
        if refused:
            await _answer(send, *refused)
            return
        limit = self.policy.max_body_bytes(kind)
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            await _answer(send, 413, f"body of {int(length)} bytes; this route takes {limit}")
            return
        await self._capped(scope, receive, send, limit)

    async def _capped(self, scope, receive, send, limit: int) -> None:
        """Run the app, stopping a chunked body the moment it passes ``limit`` bytes."""
        received = 0
        started = False

        async def capped_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _BodyTooLarge(limit)
            return message

        async def tracked_send(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, capped_receive, tracked_send)
        except _BodyTooLarge as err:
            if not started:
                await _answer(send, 413, err.detail)


async def _answer(send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:  # the scheme it takes (RFC 6750)
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
