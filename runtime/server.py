"""The generation server: vLLM's own OpenAI-compatible app plus the PipelineRL contract.

vLLM builds the app (``/v1/completions``, ``/v1/chat/completions``, ... on an
``AsyncLLM`` engine); this module mounts on it:

* ``POST /init_process_group`` — join the trainer's weight-broadcast group (one run at a
  time: :mod:`runtime.lease`; ``POST /renew`` keeps the holder's hold, ``POST /release``
  frees the server at the run's end);
* ``POST /request_weight_update`` — pause (keep), receive and load, resume; answers when
  loaded (see :mod:`runtime.control`);
* ``GET /v1/tandem/params`` — the served model's parameter names and shapes;
* ``GET /health`` — replaces vLLM's, adding the served weight version, the run it
  serves, a join under way and the server's random ``server_id``;
* ``GET /weights/checksums`` — checksums of the last loaded tensors (checkpoint layout);
* ``POST /v1/tandem/generate`` — the actor's route: many samples per request, each
  streamed back as it finishes, with its weight versions (see :mod:`runtime.batch_gen`);
* the headers ``X-Tandem-Version-Start`` / ``X-Tandem-Version-End`` on every response: the
  weight version when the request arrived and when its response started.

A refusal of these routes names the request field at fault in the error body's ``param``,
as vLLM's validation errors do (:mod:`runtime.route_errors`).

Every request passes :class:`runtime.guard.Guard` first, before its body is read: control
routes (ours and any other route that is neither inference nor a public probe) need
``Authorization: Bearer <token>``, inference routes the API key if one is set, and
bodies are capped. The server refuses to start without a token unless told
``--insecure-no-token``. Binds 127.0.0.1 by default. Every process vLLM starts below it
dies with it (:func:`runtime.procs.reap_forks_with_parent`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.middleware import Middleware

from runtime.batch_gen import BatchBody, BatchGenerator
from runtime.contract_bodies import (
    HealthResponse,
    InitGroupBody,
    JoiningState,
    ReleaseBody,
    RenewResponse,
    UpdateResponse,
    WeightUpdateBody,
)
from runtime.control import ServerControl, UpdateRejected, checkpoint_manifest
from runtime.cpu_seed_rewind import SEED_REWIND_ENV
from runtime.direct_load import DIRECT_ENV
from runtime.engine_proc import (
    KV_SPACE_ENV,
    renice_engine,
    restrict_for_engine_start,
    vllm_args,
)
from runtime.engine_watch import stall_s_from_env
from runtime.guard import Guard, GuardPolicy
from runtime.http_pool import SERVER_KEEP_ALIVE_S
from runtime.joining import JoinUnderWay, join_connect_s_from_env
from runtime.lease import LeaseHeld, RunLease, lease_s_from_env
from runtime.lifetime import exit_without_finalizing
from runtime.procs import ENGINE_CORES_ENV, ENGINE_NICE_ENV, die_with_parent, reap_forks_with_parent
from runtime.route_errors import RouteError, install_route_errors
from runtime.server_stop import StopNotingLoop, quiet_engine_dead_at_stop
from runtime.vllm_plugin import SPIN_ENV
from runtime.weight_sync import BucketDigest, ParamMeta

if __name__ == "__mp_main__":  # a process vLLM spawned below this server: die with it
    die_with_parent(signal.SIGKILL)


def control_router(control: ServerControl, lease: RunLease) -> APIRouter:
    """The contract's routes (the :class:`runtime.guard.Guard` in front checks tokens);
    ``lease``: one run at a time (runtime.lease)."""
    router = APIRouter()
    _weight_group_routes(router, control, lease)
    batch = BatchGenerator(control.engine, control)

    @router.post("/v1/tandem/generate")  # inference: never touches the lease (runtime.lease)
    async def tandem_generate(body: BatchBody) -> StreamingResponse:
        return StreamingResponse(batch.stream(body), media_type="application/x-ndjson")

    @router.get("/v1/tandem/params")
    async def params() -> dict:  # a run checks its trainer's model against the served one
        return {"params": [[name, list(shape)] for name, (shape, _) in control.manifest.items()]}

    @router.get("/weights/checksums")
    async def checksums() -> dict:
        return {"version": control.version, "checksums": await control.checksums()}

    @router.get("/health")
    async def health() -> JSONResponse:
        status, stalled = control.condition()
        body = HealthResponse(
            status=status,
            version=control.version,
            num_updates=control.num_updates,
            last_pause_s=control.last_pause_s,
            pauses_for_updates=control.pauses,
            pid=os.getpid(),
            owner=lease.owner,
            free_in_s=lease.free_in_s(),
            stalled_s=stalled,
            server_id=control.server_id,
            joining=_joining_state(control.joining),
        )
        return JSONResponse(body.model_dump(), status_code=200 if body.status == "ok" else 503)

    return router


def _joining_state(join: JoinUnderWay | None) -> JoiningState | None:
    if join is None:
        return None
    return JoiningState(
        rank=join.rank, world_size=join.world_size, owner=join.owner, ends_in_s=join.ends_in_s()
    )


def _weight_group_routes(router: APIRouter, control: ServerControl, lease: RunLease) -> None:
    """Joining the trainer's weight group, loading its updates, leaving the server free."""

    @router.post("/init_process_group")
    async def init_process_group(body: InitGroupBody) -> dict:
        if body.rank >= body.world_size:
            raise RouteError(
                400, f"rank: {body.rank} must be < world_size {body.world_size}", "rank"
            )
        try:
            await control.check_join(body.master_addr, body.master_port, body.backend)
            lease.check(body.owner)  # no await from here to the join's start: no other joins
            await control.join_group(
                body.master_addr, body.master_port, body.rank, body.world_size, body.backend,
                body.timeout_s, body.owner,
            )  # fmt: skip
        except UpdateRejected as err:
            raise RouteError(err.status, str(err), err.field) from None
        except LeaseHeld as err:
            raise RouteError(409, str(err), "owner") from None
        except Exception as err:  # the trainer never came (timeout), nothing listened...
            raise RouteError(504, f"joining the weight group failed: {err}") from None
        lease.claim(body.owner)  # joined: a join that failed leaves the lease as it was
        return {"joined": True, "rank": body.rank}

    @router.post("/request_weight_update")
    async def request_weight_update(body: WeightUpdateBody) -> UpdateResponse:
        lease.renew()  # a control route: the token was checked (runtime.guard)
        metas = [ParamMeta(p.name, tuple(p.shape), p.dtype) for p in body.params]
        digests = [BucketDigest(**b.model_dump()) for b in body.buckets or []]
        try:
            result = await control.update(body.version, metas, digests, body.timeout_s)
        except UpdateRejected as err:  # the previous weights keep serving
            raise RouteError(err.status, str(err), err.field) from None
        except Exception as err:  # the previous weights keep serving
            raise RouteError(500, f"weight update failed: {err}") from None
        return UpdateResponse(
            version=result.version,
            num_tensors=result.num_tensors,
            pause_s=result.pause_s,
            stages_ms=result.stages_ms,
        )

    @router.post("/renew")  # a control route: the token was checked (runtime.guard)
    async def renew(body: ReleaseBody) -> RenewResponse:
        try:
            lease.renew_by(body.owner)
        except LeaseHeld as err:
            raise RouteError(409, str(err), "owner") from None
        return RenewResponse(owner=body.owner, lease_s=lease.lease_s)

    @router.post("/release")
    async def release(body: ReleaseBody) -> dict:
        return {"released": lease.release(body.owner)}


class VersionHeaders:
    """ASGI middleware: weight version at a request's arrival and at its response start."""

    def __init__(self, app, control: ServerControl) -> None:
        self.app = app
        self.control = control

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = str(self.control.version).encode()

        async def send_with_version(message) -> None:
            if message["type"] == "http.response.start":
                end = str(self.control.version).encode()
                headers = list(message.get("headers", []))
                headers += [(b"x-tandem-version-start", start), (b"x-tandem-version-end", end)]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_version)


def mount_contract(app: FastAPI, control: ServerControl, policy: GuardPolicy) -> None:
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != "/health"]
    router = control_router(control, RunLease(lease_s_from_env()))
    app.include_router(router)
    install_route_errors(app, {getattr(r, "path", "") for r in router.routes})
    # vLLM has already built the middleware stack: add ours and let Starlette rebuild it;
    # the guard goes first (outermost): nothing is read before it has checked
    app.user_middleware.insert(0, Middleware(VersionHeaders, control=control))
    app.user_middleware.insert(0, Middleware(Guard, policy=policy))
    app.middleware_stack = None


# the engine's busy-wait before it sleeps (runtime/vllm_plugin.py): 2 ms spans the round
# trips inside one decode step; vLLM's own 1 s took a core from the trainer or another server
ENGINE_SPIN_MS = 2.0
EXECUTOR_ENV = "TANDEM_ENGINE_EXECUTOR"
# "uni": the model runs inside the engine-core process; "mp" (what vLLM's CPU platform
# picks by itself): in a worker process of its own, fed through a shared-memory queue
# whose spin and zmq wake-ups took ~70% of the engine core's CPU and ~30% of the worker's
# with the tiny model (py-spy; docs/live-throughput.md)
EXECUTORS = ("uni", "mp")


async def _serve(args: argparse.Namespace, policy: GuardPolicy) -> None:
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.launcher import serve_http, setup_server

    quiet_engine_dead_at_stop(asyncio.get_running_loop())  # a stop's log reads as one
    _, sock = setup_server(args, reuse_port=False)
    frontend_cores = restrict_for_engine_start(os.environ.get(ENGINE_CORES_ENV))
    async with build_async_engine_client(args) as engine:
        os.sched_setaffinity(0, frontend_cores)
        renice_engine(int(os.environ.get(ENGINE_NICE_ENV) or 0))
        tasks = await engine.get_supported_tasks()
        app = build_app(args, tasks, engine.model_config)
        served_dtype = str(engine.model_config.dtype).removeprefix("torch.")
        control = ServerControl(
            engine, checkpoint_manifest(args.model), served_dtype, args.host, stall_s_from_env(),
            join_connect_s_from_env(),
        )  # fmt: skip
        control.salt_requests()  # prompt KV is shared within one weight version only
        mount_contract(app, control, policy)
        await init_app_state(engine, app.state, args, tasks)
        shutdown = await serve_http(
            app,
            sock=sock,
            host=args.host,
            port=args.port,
            log_level="warning",
            access_log=False,
            timeout_keep_alive=SERVER_KEEP_ALIVE_S,
        )
    try:
        await shutdown
    finally:
        sock.close()


def serve_main(
    model_dir: str, host: str = "127.0.0.1", port: int = 8400, policy: GuardPolicy | None = None,
    max_model_len: int = 512, max_num_seqs: int = 64, engine_spin_ms: float = ENGINE_SPIN_MS,
    executor: str = "uni", kv_cache_gib: float | None = None,
) -> None:  # fmt: skip
    """Serve ``model_dir`` until interrupted (``python -m runtime.server``, ``tandem serve``).

    ``engine_spin_ms``: how long the engine's processes busy-wait for each other's next
    message before they sleep (runtime/vllm_plugin.py; vLLM's own: 1000). ``executor``:
    where the model runs (``EXECUTORS``). ``kv_cache_gib``: the KV cache on the CPU
    (None: ``VLLM_CPU_KVCACHE_SPACE``, else 1 GiB)."""
    if policy is None or (policy.token is None and not policy.insecure_no_token):
        raise ValueError("the control routes need a token (or insecure_no_token)")
    if not engine_spin_ms >= 0:
        raise ValueError(f"--engine-spin-ms {engine_spin_ms}: expected milliseconds >= 0")
    if executor not in EXECUTORS:
        raise ValueError(f"--executor {executor!r}: expected one of {', '.join(EXECUTORS)}")
    # vLLM's CPU platform keeps the in-process ("uni") executor only when this is "0"; its
    # async frontend runs the engine core in a process of its own either way
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if executor == "uni" else "1"
    if kv_cache_gib is None:
        os.environ.setdefault(KV_SPACE_ENV, "1")
    else:  # vLLM's variable, in whole GiB, would override the exact size
        os.environ.pop(KV_SPACE_ENV, None)
    os.environ[SPIN_ENV] = str(engine_spin_ms)  # read by the plugin in each engine process
    # the plugin keeps kernel weights for direct loads (TANDEM_DIRECT_LOAD=0: vLLM's reload)
    os.environ.setdefault(DIRECT_ENV, "1")
    os.environ.setdefault(SEED_REWIND_ENV, "1")  # seeded chunked prefills on vLLM-CPU
    reap_forks_with_parent()  # before vLLM forks its engine core and worker
    args = vllm_args(model_dir, host, port, max_model_len, max_num_seqs, kv_cache_gib)
    with asyncio.Runner(loop_factory=StopNotingLoop) as runner:  # runtime.server_stop
        runner.run(_serve(args, policy))


def main() -> None:
    parser = argparse.ArgumentParser(description="tandem generation server")
    parser.add_argument("model_dir")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8400)
    parser.add_argument("--token", default=os.environ.get("TANDEM_TOKEN") or None)
    parser.add_argument("--insecure-no-token", action="store_true")
    parser.add_argument("--api-key", default=os.environ.get("TANDEM_API_KEY") or None)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--kv-cache-gib", type=float, default=None)
    parser.add_argument(
        "--engine-spin-ms",
        type=float,
        default=float(os.environ.get(SPIN_ENV) or ENGINE_SPIN_MS),
        help="busy-wait of the engine's processes before they sleep (vLLM's own: 1000)",
    )
    parser.add_argument(
        "--executor",
        choices=EXECUTORS,
        default=os.environ.get(EXECUTOR_ENV) or "uni",
        help="uni: the model runs in the engine-core process; mp: in a worker of its own",
    )
    ns = parser.parse_args()
    if ns.token is None and not ns.insecure_no_token:
        sys.exit(
            "runtime.server: the control routes need a token: --token SECRET (or "
            "TANDEM_TOKEN), or --insecure-no-token to leave them open"
        )
    policy = GuardPolicy(token=ns.token, api_key=ns.api_key, insecure_no_token=ns.insecure_no_token)
    serve_main(
        ns.model_dir, ns.host, ns.port, policy, ns.max_model_len, ns.max_num_seqs,
        ns.engine_spin_ms, ns.executor, ns.kv_cache_gib,
    )  # fmt: skip
    exit_without_finalizing(0)  # else Triton's bindings list "leaked" types into the log


if __name__ == "__main__":
    main()
