"""``tandem bench live``: the pipeline modes on ``live-tiny.yaml``, on one shared server.

For each mode: samples/s and its ratio to ``disagg-sync``. Also the actor's generation
tokens/s (output tokens over the instance's busy time in the ``disagg-sync`` run) over
raw vLLM on the same prompts (one batched ``/v1/completions`` call: vLLM's own
scheduler with no per-request round trips), and the median pause of an in-flight
weight update (the servers' ``weight_sync`` spans). Prints nothing; returns a dict.
"""

from __future__ import annotations

import secrets
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from policies.spec import load_spec
from runtime.launcher import model_dir_for, run_live
from runtime.procs import free_port, split_cores, start_server, stop_server, wait_healthy
from runtime.tasks import TaskSet

MODES = ("disagg-sync", "stream-sync", "stream-async", "pipeline")
DEFAULT_CONFIG = (
    Path(__file__).resolve().parent.parent / "experiments" / "configs" / "live-tiny.yaml"
)


def raw_tokens_per_s(
    base_url: str, prompts: list[str], max_tokens: int, temperature: float
) -> float:
    body = {
        "model": "tandem",
        "prompt": prompts,
        "max_tokens": max_tokens,
        "temperature": temperature,
    }
    start = time.perf_counter()
    resp = httpx.post(base_url + "/v1/completions", json=body, timeout=600)
    elapsed = time.perf_counter() - start
    resp.raise_for_status()
    return resp.json()["usage"]["completion_tokens"] / elapsed


def _actor_tokens_per_s(frame_samples, frame_events) -> float:
    gen = frame_events[(frame_events["resource"] == "gen-0") & (frame_events["kind"] == "decode")]
    busy_s = float((gen["end_s"] - gen["start_s"]).sum())
    return float(frame_samples["output_tokens"].sum()) / busy_s if busy_s else 0.0


def bench_live(
    config: str | Path | None = None, steps: int = 6, out_dir: str | Path | None = None
) -> dict:
    """Run each mode for ``steps`` optimizer steps on one server; return the figures."""
    base = load_spec(config or DEFAULT_CONFIG, [f"run.iterations={steps}"])
    out = Path(out_dir or tempfile.mkdtemp(prefix="tandem-bench-"))
    token = secrets.token_hex(8)
    server = start_server(
        0, model_dir_for(base), "127.0.0.1", free_port(), token, split_cores(1)[0], base.live.kv_cache_gib,
        base.live.max_model_len, base.cluster.generation[0].max_num_seqs, out / "logs",
    )  # fmt: skip
    try:
        wait_healthy(server, base.live.startup_timeout_s)
        return _bench_modes(base, server.base_url, token, out)
    finally:
        stop_server(server)


def _bench_modes(base, url: str, token: str, out: Path) -> dict:
    rates, pauses, actor_tps, prompts = {}, [], 0.0, []
    for mode in MODES:
        spec = base.model_copy(deep=True)
        spec.live.server_urls, spec.live.token, spec.pipeline.mode = [url], token, mode
        result = run_live(spec, out / mode)
        rates[mode] = result.metrics["throughput_samples_per_s"]
        events = result.spans_frame()
        syncs = events[(events["resource"] == "gen-0") & (events["kind"] == "weight_sync")]
        pauses += (syncs["end_s"] - syncs["start_s"]).tolist()
        if mode == "disagg-sync":
            actor_tps = _actor_tokens_per_s(result.samples_frame(), events)
            tasks = TaskSet(
                spec.run.seed, spec.workload.num_prompts, spec.workload.max_output_tokens
            )
            prompts = [tasks[s.prompt_id].text for s in result.samples]
    raw = raw_tokens_per_s(url, prompts, base.workload.max_output_tokens, base.live.temperature)
    return {
        "samples_per_s": rates,
        "ratio_to_disagg_sync": {m: r / rates["disagg-sync"] for m, r in rates.items()},
        "actor_tokens_per_s": actor_tps,
        "raw_vllm_tokens_per_s": raw,
        "actor_over_raw": actor_tps / raw if raw else None,
        "median_update_pause_ms": statistics.median(pauses) * 1000 if pauses else None,
        "steps": base.run.iterations,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(bench_live()))
