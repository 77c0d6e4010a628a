"""Local processes of a live run: generation servers, core pinning, clean shutdown.

Nothing a run starts outlives it: every server runs in its own process group (session),
which :func:`stop_server` always kills whole, even when its leader is already gone; and
every child is asked to die with its parent (:func:`die_with_parent`, Linux's
``PR_SET_PDEATHSIG``): the trainer, each server, and (:func:`reap_forks_with_parent`,
installed by the server) the engine-core and worker processes vLLM forks below it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx

from runtime.errors import ProcessDied, StartTimedOut, describe_exit
from runtime.lifetime import die_with_parent, reap_forks_with_parent

__all__ = ["die_with_parent", "reap_forks_with_parent"]  # their home: runtime.lifetime

ENGINE_CORES_ENV = "TANDEM_ENGINE_CORES"  # cores the server pins its engine processes to
ENGINE_NICE_ENV = "TANDEM_ENGINE_NICE"  # niceness the server gives its engine processes

logger = logging.getLogger(__name__)


def split_cores(num_servers: int, time_shared: bool = False) -> tuple[list[int], list[int]]:
    """(generation cores, training cores): the first half generates, the second trains;
    ``time_shared`` (the stages take turns): training gets every core. That needs an
    engine that sleeps when idle: with vLLM's own 1 s busy-wait the trainer's second
    thread ran on a spinning core and ``colocated-sync`` was 2-3x slower
    (runtime/vllm_plugin.py, docs/live-throughput.md)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return cores, cores
    if time_shared:
        return cores[: max(1, len(cores) // 2)], cores
    half = max(1, len(cores) // 2)
    return cores[:half], cores[half:]


def server_core_sets(num_servers: int, gen_cores: list[int], spread: bool) -> list[list[int]]:
    """The cores each server's engine is pinned to: the generation cores, shared by all;
    or, with ``spread`` and several servers, one core each, round robin over every core
    this process may use. Spread suits the wave modes: a batch ends with its slowest
    answers, and two engines sharing one core decoded those at half speed while the
    trainer's core waited for them (docs/live-throughput.md)."""
    if not spread or num_servers < 2:
        return [gen_cores] * max(1, num_servers)
    cores = sorted(os.sched_getaffinity(0))
    return [[cores[i % len(cores)]] for i in range(num_servers)]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    """Would a server fail to listen on ``host:port`` (bound as uvicorn binds it) because
    something holds the port? Any other failure (a name that does not resolve, an address
    not on this machine, a port it may not take) is a ``ValueError`` saying which."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                return True
            raise ValueError(
                f"{host}:{port}: a server cannot listen there ({_reason(err)})"
            ) from None
    return False


def check_listen_host(host: str, key: str) -> None:
    """A ``ValueError`` naming ``key`` unless a server can listen on ``host``: a name that
    resolves to an address of this machine (before: "port already in use", whatever the
    cause, and only once the run had started)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, 0))
    except OSError as err:
        raise ValueError(
            f"{key} {host!r}: a server cannot listen there ({_reason(err)}); give a name or "
            "address of this machine, e.g. 127.0.0.1"
        ) from None


def _reason(err: OSError) -> str:
    if isinstance(err, socket.gaierror):
        return f"the name does not resolve: {err.strerror}"
    return err.strerror or str(err)


@dataclass(slots=True)
class ServerProcess:
    instance_id: int
    base_url: str
    proc: subprocess.Popen
    log_path: Path
    log_start: int = 0  # where this process's output begins in the log (a restart appends)

    def log_text(self) -> str:
        """This process's own output (not an earlier process's, above it in the log)."""
        with open(self.log_path, "rb") as log:
            log.seek(self.log_start)
            return log.read().decode(errors="replace")


def engine_pinning(cores: list[int]) -> dict[str, str]:
    """The environment that pins a server's engine processes (and vLLM's OpenMP threads)
    to ``cores``."""
    listed = ",".join(map(str, cores))
    return {"VLLM_CPU_OMP_THREADS_BIND": listed, ENGINE_CORES_ENV: listed}


def start_server(
    instance_id: int, model_dir: str, host: str, port: int, token: str, cores: list[int],
    kv_cache_gib: float, max_model_len: int, max_num_seqs: int, log_dir: Path,
    api_key: str | None = None, engine_nice: int = 0,
) -> ServerProcess:  # fmt: skip
    """``python -m runtime.server`` with its engine pinned to ``cores``, in its own process
    group (``stop_server`` signals the whole group; Ctrl-C at a terminal does not reach it)
    but in this session: Linux's autogroup scheduling puts each session in its own group,
    and two servers' engines sharing a core as two groups took turns of up to a second
    each (a decode step waited ~1 s runnable; docs/live-throughput.md).

    The engine's processes (scheduler and model worker, whose OpenMP threads vLLM binds
    to ``VLLM_CPU_OMP_THREADS_BIND``) are pinned; the HTTP frontend stays free to run on
    any core. Pinned to the engine's core, the frontend's per-sample work queued behind
    decode steps: with the tiny model the actor reached ~0.8 of vLLM's own tokens/s,
    unpinned ~0.95 (``tandem bench live``). ``engine_nice``: the engine's processes run at
    that niceness once started, the frontend at this process's."""
    if port_in_use(host, port):  # else /health could answer from whoever holds the port
        raise ValueError(
            f"generation server {instance_id}: {host}:{port} is already in use (another "
            "server or run?): choose another live.base_port, or attach to running servers "
            "with live.server_urls"
        )
    env = {
        **os.environ,
        "TANDEM_TOKEN": token,
        **engine_pinning(cores),
        ENGINE_NICE_ENV: str(engine_nice),
        "TANDEM_API_KEY": api_key or "",
    }
    cmd = [
        sys.executable, "-m", "runtime.server", model_dir, "--host", host, "--port", str(port),
        "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
        "--kv-cache-gib", repr(kv_cache_gib),
    ]  # fmt: skip
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"server-{instance_id}.log"
    launcher_pid = os.getpid()
    logger.info(
        "starting vLLM server %d on %s:%d, engine niceness %d (log %s)",
        instance_id, host, port, engine_nice, log_path,
    )  # fmt: skip

    def setup() -> None:
        die_with_parent(signal.SIGKILL, launcher_pid)

    with open(log_path, "ab") as log:  # a restarted server keeps its predecessor's log
        if log.tell() > 0:
            log.write(_started_again(instance_id))
            log.flush()  # before the new process writes to the same file
        start = log.tell()
        proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=setup,
            process_group=0, cwd=str(Path(__file__).resolve().parent.parent),
        )  # fmt: skip
    return ServerProcess(instance_id, f"http://{host}:{port}", proc, log_path, start)


def _started_again(instance_id: int) -> bytes:
    """The line between a server's earlier process's log and its new one's."""
    when = datetime.now(UTC).isoformat(timespec="seconds")
    line = (
        f"===== generation server {instance_id} started again at {when}; above: its earlier process"
    )
    return f"\n{line} =====\n".encode()


def describe_server(server: ServerProcess) -> str:
    """``generation server 1 (pid 4242, http://...)``: how errors name a server."""
    return f"generation server {server.instance_id} (pid {server.proc.pid}, {server.base_url})"


def server_died(server: ServerProcess, when: str) -> ProcessDied:
    """The error for a server that exited: names it, its exit signal and its log."""
    how = describe_exit(server.proc.poll())
    return ProcessDied(f"{describe_server(server)} {how} {when} (log: {server.log_path})")


def wait_healthy(server: ServerProcess, timeout_s: float = 300.0) -> None:
    """Return once ``server`` answers ``/health``; a :class:`ProcessDied` if it exits first,
    a :class:`StartTimedOut` naming its log and ``live.startup_timeout_s`` after ``timeout_s``."""
    start = time.monotonic()
    deadline = start + timeout_s
    logger.info("waiting for server %d: vLLM engine start (~35 s on a CPU)", server.instance_id)
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            text = server.log_text()
            error = server_died(server, "during start-up")
            raise ProcessDied(f"{error}{start_up_cause(text)}; its log ends:\n{text[-3000:]}")
        try:
            health = httpx.get(server.base_url + "/health", timeout=2.0)
        except httpx.HTTPError:
            health = None
        if health is not None and health.status_code == 200:
            answered = health_json(health).get("pid")
            if answered != server.proc.pid:  # the port went to another process meanwhile
                raise ValueError(
                    f"{describe_server(server)}: the port is served by another process "
                    f"(pid {answered}), so this server cannot bind it: another run started "
                    "there meanwhile? choose another live.base_port"
                )
            logger.info(
                "server %d healthy after %.0f s", server.instance_id, time.monotonic() - start
            )
            return
        time.sleep(0.5)
    raise StartTimedOut(
        f"{describe_server(server)} not healthy after {timeout_s:g} s (log: {server.log_path}): "
        "its engine may still be starting; raise live.startup_timeout_s"
    )


_ERROR_LINE = re.compile(r"(?:^|\] )((?:\w+\.)*\w*(?:Error|Exception): .+)$", re.MULTILINE)
_KV_SHORT = ("No available memory for the cache blocks", "KV cache is needed")


def start_up_cause(log_text: str) -> str:
    """``: ValueError: ...``, the first error a server's log names (vLLM's last line only
    points "above" to it), with the spec key behind a KV cache too small; "" if none."""
    causes = [m for m in _ERROR_LINE.findall(log_text) if "root cause above" not in m]
    if not causes:
        return ""
    hint = ""
    if any(k in causes[0] for k in _KV_SHORT):
        hint = " (live.kv_cache_gib too small for one sequence of live.max_model_len?)"
    return f": {causes[0].strip()}{hint}"


def health_json(health: httpx.Response) -> dict:
    """A ``/health`` answer's body ({} where it is not tandem's JSON object)."""
    try:
        body = health.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def health_says(health: httpx.Response) -> str | None:
    """None for a ``/health`` 200, else what it says: its status and, for a stalled engine,
    how long it has held requests without a step (runtime.control's 503 states)."""
    if health.status_code == 200:
        return None
    state = health_json(health)
    stalled = state.get("stalled_s")
    held = f": its engine has held requests {stalled:.0f} s without a step" if stalled else ""
    return f"answers /health {health.status_code} {state.get('status', '')}{held}".rstrip()


def group_alive(pgid: int) -> bool:
    """Is any process of process group ``pgid`` still running (zombies do not count)?"""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def stop_server(server: ServerProcess, grace_s: float = 15.0) -> None:
    """SIGTERM the server's whole process group (API server, engine core, worker), then
    SIGKILL what is left. Always the group: a leader that already died (killed, crashed)
    leaves its engine processes running otherwise."""
    pgid = server.proc.pid  # started as a process group's leader: its pid is the group's
    if server.proc.poll() is not None and not group_alive(pgid):
        return  # stopped already (a run stops its servers, then every slot again)
    logger.info("stopping server %d", server.instance_id)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (server.proc.poll() is None or group_alive(pgid)):
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    server.proc.wait()
