"""The ``tandem serve`` command: checks its arguments, then becomes ``python -m runtime.server``."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import Any

from experiments.arg_types import port, positive_float, positive_int
from runtime.model import check_model_dir, context_tokens
from runtime.tasks import check_model_context


def add_serve_parser(sub: Any) -> None:
    serve = sub.add_parser("serve", help="a vLLM generation server with the PipelineRL routes")
    serve.add_argument(
        "model_dir", help="Hugging Face model directory (tandem model path, tandem export --out)"
    )
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=port, default=8400, help="port (default 8400)")
    serve.add_argument(
        "--token", default=None, help="bearer token of the control routes (or TANDEM_TOKEN)"
    )
    serve.add_argument(
        "--insecure-no-token",
        action="store_true",
        help="serve the control routes without a token (anyone reaching the port may load weights)",
    )
    serve.add_argument(
        "--api-key",
        default=None,
        help="bearer key the inference routes (/v1/...) require (or TANDEM_API_KEY)",
    )
    serve.add_argument(
        "--max-model-len",
        type=positive_int,
        default=512,
        help="context of a sequence, prompt and answer, tokens (default 512; a run refuses a "
        "server whose context cannot hold its longest prompt and workload.max_output_tokens)",
    )
    serve.add_argument(
        "--max-num-seqs",
        type=positive_int,
        default=64,
        help="sequences the engine batches at once (default 64)",
    )
    serve.add_argument(
        "--kv-cache-gib",
        type=positive_float,
        default=None,
        help="KV cache of a CPU engine, GiB (default: VLLM_CPU_KVCACHE_SPACE, else 1)",
    )
    serve.add_argument(
        "--cores",
        type=core_list,
        default=None,
        help="cores the engine's processes are pinned to, e.g. 0 or 0,1, or 'all' for vLLM's "
        "own binding (default: the first half of this machine's cores, where a run's own "
        "server goes: an attached run's trainer takes the other half)",
    )
    serve.set_defaults(func=cmd_serve)


def core_list(text: str) -> list[int]:
    """``--cores``: a comma list of cores this process may use, or ``all`` (``[]``: none
    pinned)."""
    if text.strip() == "all":
        return []
    allowed = sorted(os.sched_getaffinity(0))
    try:
        cores = sorted({int(c) for c in text.split(",") if c.strip()})
    except ValueError:
        cores = []
    if not cores or not set(cores) <= set(allowed):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected 'all' or a comma list of cores among {allowed}"
        )
    return cores


def cmd_serve(args: argparse.Namespace) -> int:
    """Check the arguments, then become ``python -m runtime.server`` (exec): every process
    vLLM starts below it then dies with it (runtime.server), and the token stays out of
    the command line (``ps``)."""
    token = args.token or os.environ.get("TANDEM_TOKEN")
    if not token and not args.insecure_no_token:
        raise ValueError(
            "serve: the control routes (/init_process_group, /request_weight_update, "
            "/weights/checksums) need a token: pass --token SECRET (or set TANDEM_TOKEN), "
            "or --insecure-no-token to leave them open to anyone who reaches the port"
        )
    for module in ("vllm", "torch", "fastapi"):
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)
    check_model_dir(args.model_dir, "serve: model directory")
    # else vLLM's traceback after its engine started
    check_model_context(
        args.max_model_len, context_tokens(args.model_dir), "serve: --max-model-len"
    )
    from runtime.procs import check_listen_host, engine_pinning, port_in_use, split_cores

    check_listen_host(args.host, "serve: --host")
    if port_in_use(args.host, args.port):  # else vLLM's traceback, after its engine started
        raise ValueError(
            f"serve: {args.host}:{args.port} is already in use (another server or process "
            "listens there); choose another --port"
        )
    env = {**os.environ, "TANDEM_TOKEN": token or ""}
    if args.api_key:
        env["TANDEM_API_KEY"] = args.api_key
    cores = split_cores(1)[0] if args.cores is None else args.cores  # ``all``: []
    if cores:  # as runtime.procs.start_server pins a run's own server
        env.update(engine_pinning(cores))
    cmd = [sys.executable, "-m", "runtime.server", args.model_dir, "--host", args.host,
           "--port", str(args.port), "--max-model-len", str(args.max_model_len),
           "--max-num-seqs", str(args.max_num_seqs)]  # fmt: skip
    if args.kv_cache_gib is not None:
        cmd += ["--kv-cache-gib", repr(args.kv_cache_gib)]
    if not token:
        cmd.append("--insecure-no-token")
    os.execve(sys.executable, cmd, env)
    return 0  # not reached
