"""How a generation server's engine is configured and how its failed start is reported."""

from __future__ import annotations

import pytest

from runtime.procs import start_up_cause

VLLM_LOG = """\
Found ulimit of 20000 and failed to automatically increase with error current limit \
exceeds maximum limit. This can cause fd limit errors like `OSError: [Errno 24] Too many`
(EngineCore pid=5013) INFO 12-05 16:15:39 [cpu_worker.py:260] Explicitly set (0.0/23.54) GiB
(EngineCore pid=5013) ERROR 12-05 16:15:39 [core.py:1510] Traceback (most recent call last):
(EngineCore pid=5013) ERROR 12-05 16:15:39 [core.py:1510] ValueError: No available memory \
for the cache blocks. Try increasing `gpu_memory_utilization`
Traceback (most recent call last):
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_a_failed_start_names_the_first_error_not_vllms_pointer_to_it():
    """Before: the run's error ended in the log's last 3000 characters, where vLLM's last
    line only says "See root cause above" (a KV cache too small for one sequence)."""
    cause = start_up_cause(VLLM_LOG)
    assert cause.startswith(": ValueError: No available memory for the cache blocks")
    assert cause.endswith("(live.kv_cache_gib too small for one sequence of live.max_model_len?)")
    other = "x\n[core.py:1] ImportError: no module named foo\n"
    assert start_up_cause(other) == ": ImportError: no module named foo"
    assert start_up_cause("INFO all well\n") == ""


@pytest.mark.live
def test_the_kv_cache_reaches_vllm_in_bytes_not_rounded_to_whole_gib():
    """Before: ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB) turned live.kv_cache_gib 0.25 into 1."""
    from runtime.engine_proc import GIB, vllm_args

    args = vllm_args("/nonexistent", "127.0.0.1", 8400, 512, 64, kv_cache_gib=0.25)
    assert args.kv_cache_memory_bytes == GIB // 4
    assert vllm_args("/nonexistent", "127.0.0.1", 8400, 512, 64).kv_cache_memory_bytes is None
