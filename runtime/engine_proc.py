"""How a generation server starts its vLLM engine: the engine's arguments, and the cores
and niceness its processes get (the HTTP frontend, :mod:`runtime.server`, keeps its own).

``live.kv_cache_gib`` reaches vLLM as ``--kv-cache-memory-bytes`` on the CPU: vLLM's
``VLLM_CPU_KVCACHE_SPACE`` takes whole GiB only, so 0.25 became 1 and 2.6 became 3.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from runtime.host_cpu import descendants

SERVED_MODEL_NAME = "tandem"
GPU_SHARE_ENV = "TANDEM_GPU_MEMORY_UTILIZATION"
KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"  # vLLM's own, whole GiB; unset where bytes are given
GIB = 2**30


def vllm_args(
    model_dir: str, host: str, port: int, max_model_len: int, max_num_seqs: int,
    kv_cache_gib: float | None = None,
) -> argparse.Namespace:  # fmt: skip
    """vLLM's arguments for a tandem server; ``kv_cache_gib`` sizes the KV cache on a CPU
    host (a GPU's comes from its memory share)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    # on a GPU shared with the trainer (scripts/gpu-check.sh), leave it room
    share = os.environ.get(GPU_SHARE_ENV)
    kv_bytes = int(kv_cache_gib * GIB) if kv_cache_gib is not None and _on_cpu() else None
    return parser.parse_args(
        [
            "--model", model_dir, "--host", host, "--port", str(port),
            "--served-model-name", SERVED_MODEL_NAME, "--dtype", "float32",
            "--enforce-eager", "--max-model-len", str(max_model_len),
            "--worker-extension-cls", "runtime.weight_sync.WeightReceiver",
            "--disable-uvicorn-access-log", "--max-logprobs", "1",
            "--max-num-seqs", str(max_num_seqs), "--scheduling-policy", "priority",
            *(["--gpu-memory-utilization", share] if share else []),
            *(["--kv-cache-memory-bytes", str(kv_bytes)] if kv_bytes else []),
        ]
    )  # fmt: skip


def restrict_for_engine_start(cores: str | None) -> set[int]:
    """Restrict this process to ``cores`` ("0,1") so that the engine core (scheduler) and
    model worker processes it is about to spawn inherit them; returns the affinity to
    restore once they run, so that this process (the HTTP frontend) runs anywhere.

    The scheduler and the worker busy-wait on each other between decode steps (vLLM's
    shared-memory queue spins; ``--engine-spin-ms``): on the worker's own core that spin
    yields to the worker; on another core it would take CPU from the trainer."""
    before = os.sched_getaffinity(0)
    if cores:
        os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
    return before


def renice_engine(nice: int) -> int:
    """Give every thread of this process's descendants (the engine core and any model
    worker) niceness ``nice``, leaving this process (the HTTP frontend) as it is; returns
    how many threads. Linux keeps a niceness per thread, and threads started later inherit
    their starter's, so the engine's later threads (weight receivers) get it too."""
    if not nice:
        return 0
    threads = 0
    for pid in descendants(os.getpid()):
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                os.setpriority(os.PRIO_PROCESS, int(task.name), nice)
            except (ProcessLookupError, FileNotFoundError):
                continue  # a thread that ended meanwhile
            threads += 1
    return threads


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()
