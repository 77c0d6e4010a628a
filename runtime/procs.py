"""Local processes of a live run: generation servers, core pinning, clean shutdown."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ENGINE_CORES_ENV = "TANDEM_ENGINE_CORES"  # cores the server pins its engine processes to

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (a crashed launcher)."""
    with contextlib.suppress(OSError):  # not Linux: nothing to do
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)


def split_cores(num_servers: int) -> tuple[list[int], list[int]]:
    """(generation cores, training cores): the first half generates, the second trains."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return cores, cores
    half = max(1, len(cores) // 2)
    return cores[:half], cores[half:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(slots=True)
class ServerProcess:
    instance_id: int
    base_url: str
    proc: subprocess.Popen
    log_path: Path


def start_server(
    instance_id: int, model_dir: str, host: str, port: int, token: str, cores: list[int],
    kv_cache_gib: float, max_model_len: int, max_num_seqs: int, log_dir: Path,
) -> ServerProcess:  # fmt: skip
    """``python -m runtime.server`` with its engine pinned to ``cores``, in its own session.

    The engine's processes (scheduler and model worker, whose OpenMP threads vLLM binds
    to ``VLLM_CPU_OMP_THREADS_BIND``) are pinned; the HTTP frontend stays free to run on
    any core. Pinned to the engine's core, the frontend's per-sample work queued behind
    decode steps: with the tiny model the actor reached ~0.8 of vLLM's own tokens/s,
    unpinned ~0.95 (``tandem bench live``)."""
    env = {
        **os.environ,
        "TANDEM_TOKEN": token,
        "VLLM_CPU_KVCACHE_SPACE": str(max(1, round(kv_cache_gib))),  # whole GiB
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores)),
        ENGINE_CORES_ENV: ",".join(map(str, cores)),
    }
    cmd = [
        sys.executable, "-m", "runtime.server", model_dir, "--host", host, "--port", str(port),
        "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
    ]  # fmt: skip
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"server-{instance_id}.log"

    def setup() -> None:
        die_with_parent()

    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=setup,
            start_new_session=True, cwd=str(Path(__file__).resolve().parent.parent),
        )  # fmt: skip
    return ServerProcess(instance_id, f"http://{host}:{port}", proc, log_path)


def wait_healthy(server: ServerProcess, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            tail = server.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"server {server.instance_id} exited:\n{tail}")
        try:
            if httpx.get(server.base_url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"server {server.instance_id} not healthy after {timeout_s} s")


def stop_server(server: ServerProcess, grace_s: float = 15.0) -> None:
    """SIGTERM the server's process group (API server and engine core), then SIGKILL."""
    if server.proc.poll() is not None:
        return
    pgid = os.getpgid(server.proc.pid)
    os.killpg(pgid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.proc.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    server.proc.wait()
