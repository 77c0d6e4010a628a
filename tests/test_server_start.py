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


def test_a_restarted_server_appends_to_its_log_keeping_the_dead_ones_traceback(
    tmp_path, monkeypatch
):
    """Before: the restart opened ``server-1.log`` with "wb", and the traceback of the
    server that died (the log faults.json names) was gone."""
    import subprocess
    from types import SimpleNamespace

    import runtime.procs as procs

    said = iter([b"Traceback: the engine died\n", b"INFO healthy again\n"])

    def popen(cmd, stdout, **kwargs):
        stdout.write(next(said))  # what the server process writes to its log
        return SimpleNamespace(pid=7)

    monkeypatch.setattr(procs, "port_in_use", lambda host, port: False)
    monkeypatch.setattr(subprocess, "Popen", popen)
    for _ in range(2):
        server = procs.start_server(1, "model", "127.0.0.1", 8401, "t", [0], 1.0, 64, 4, tmp_path)
    lines = server.log_path.read_text().splitlines()
    assert server.log_path == tmp_path / "server-1.log"
    assert lines[0] == "Traceback: the engine died"
    assert lines[1] == ""
    assert lines[2].startswith("===== generation server 1 started again at ")
    assert lines[2].endswith("; above: its earlier process =====")
    assert lines[3:] == ["INFO healthy again"]
    # what start-up errors and the profiler's KV size read: the new process's output only
    assert server.log_text() == "INFO healthy again\n"
    assert "engine died" not in procs.start_up_cause(server.log_text())
