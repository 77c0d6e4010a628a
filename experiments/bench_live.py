"""``tandem bench live``: the pipeline modes on ``live-tiny.yaml``, on one shared server.

Three figures, each measured the same way for everything it compares:

* **samples/s per mode** (``disagg-sync``, ``stream-sync``, ``stream-async``,
  ``pipeline``) — each mode runs ``steps`` optimizer steps of the same spec against the
  same server, in ``rounds`` rounds: round ``r`` samples with seed ``run.seed + r`` and
  runs the modes in an order rotated by ``r``, so drift in machine load and the length of
  what a seed happens to sample hit every mode alike. A mode's samples/s is all its
  samples over all its run time; the ratio of each to ``disagg-sync``, and each round's
  ratios (their spread is the run-to-run noise);
* **actor over raw vLLM** — the generation tokens/s of one wave (one iteration's batch:
  same prompts, temperature and ``max_tokens``, every sample in flight at once) sent
  through the actor's path (:meth:`runtime.gen_client.GenerationClient.stream`: the
  dispatch in one streamed request, each completion parsed and rewarded as it arrives,
  with token ids and sampling log-probs) over vLLM's own batched generate on the same
  server (one ``/v1/completions`` request carrying every prompt, returning text only —
  its cheapest form, so the ratio errs against the actor). Both paths sample with the
  same seed, so they generate the same tokens and the ratio measures overhead alone.
  Tokens/s is output tokens over the wave's wall time, from the first byte sent to the
  last completion consumed;
  waves alternate between the two paths so that drift in machine load hits both alike;
* **median in-flight update pause** — the pause the server reported for every weight
  update of the ``pipeline`` run (all of them land while requests are running), and
  for comparison the median over the updates of every mode.

Prints nothing; returns a dict.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from experiments.ranker_source import check_ranker_path
from experiments.runs import run_live_ranked
from experiments.specs import config_path
from policies.records import Request
from policies.resources import generation_resource
from policies.results import RunResult
from policies.spec import RunSpec, load_spec, override_spec
from policies.tracking import StepUpdate
from runtime.engine_proc import SERVED_MODEL_NAME
from runtime.gen_client import GenerationClient
from runtime.live_run import model_dir_for
from runtime.procs import free_port, split_cores, start_server, stop_server, wait_healthy
from runtime.tasks import TaskPromptSource, TaskSet, task_set

MODES = ("disagg-sync", "stream-sync", "stream-async", "pipeline")
STEPS = 20  # per mode and round: live-tiny's iterations vary a lot in length (a long tail)
ROUNDS = 3
DEFAULT_CONFIG = "live-tiny"  # a shipped config (experiments/configs/)

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class WaveRate:
    output_tokens: int
    wall_s: float


def _rate(waves: list[WaveRate]) -> float:
    wall_s = sum(w.wall_s for w in waves)
    return sum(w.output_tokens for w in waves) / wall_s if wall_s else 0.0


async def raw_wave(
    http: httpx.AsyncClient, requests: list[Request], temperature: float, seed: int
) -> WaveRate:
    """vLLM's own batched generate: one ``/v1/completions`` request with every prompt,
    asking for nothing beyond the text (its cheapest form)."""
    body = {
        "model": SERVED_MODEL_NAME,
        "prompt": [r.prompt for r in requests],
        "max_tokens": requests[0].max_tokens,
        "temperature": temperature,
        "seed": seed,
    }
    start = time.perf_counter()
    resp = await http.post("/v1/completions", json=body)
    wall_s = time.perf_counter() - start
    resp.raise_for_status()
    return WaveRate(resp.json()["usage"]["completion_tokens"], wall_s)


async def actor_wave(
    client: GenerationClient, requests: list[Request], tasks: TaskSet, seed: int
) -> WaveRate:
    """The actor's path: one streamed request for the wave (as the actor dispatches it),
    each completion parsed and rewarded the moment it arrives, with token ids and
    sampling log-probs."""
    clock = time.perf_counter
    start = clock()
    num_tokens = 0
    priorities = [0] * len(requests)
    seeds = [seed] * len(requests)
    async for out in client.stream(requests, start, clock, priorities, seeds):
        tasks.reward(out.completion.request.prompt_id, out.text)
        num_tokens += out.completion.output_tokens
    return WaveRate(num_tokens, clock() - start)


async def compare_generation(spec: RunSpec, url: str, num_waves: int) -> dict:
    """Alternate actor and raw waves on the same prompts; tokens/s of each and the ratio."""
    tasks = task_set(spec)
    source = TaskPromptSource(tasks, spec.algorithm.batch_size, spec.algorithm.group_size)
    client = GenerationClient(0, url, spec.live.temperature)
    raw: list[WaveRate] = []
    actor: list[WaveRate] = []
    try:
        # warm connections and caches
        await actor_wave(client, source.batch(num_waves), tasks, spec.run.seed)
        for i in range(num_waves):
            requests = source.batch(i)
            paths = [("raw", raw), ("actor", actor)]
            for name, out in paths if i % 2 else paths[::-1]:
                seed = spec.run.seed + i  # the same sampling seed on both paths: same tokens
                if name == "raw":
                    out.append(await raw_wave(client.http, requests, spec.live.temperature, seed))
                else:
                    out.append(await actor_wave(client, requests, tasks, seed))
    finally:
        await client.aclose()
    actor_tps, raw_tps = _rate(actor), _rate(raw)
    return {
        "actor_tokens_per_s": actor_tps,
        "raw_vllm_tokens_per_s": raw_tps,
        "actor_over_raw": actor_tps / raw_tps if raw_tps else None,
        "actor_output_tokens": sum(w.output_tokens for w in actor),
        "raw_output_tokens": sum(w.output_tokens for w in raw),
        "generation_waves": num_waves,
    }


def _as_spec(config: RunSpec | str | Path | None) -> RunSpec:
    if isinstance(config, RunSpec):
        return config.model_copy(deep=True)
    return load_spec(config_path(config or DEFAULT_CONFIG))


def bench_live(
    config: RunSpec | str | Path | None = None,
    steps: int | None = None,
    out_dir: str | Path | None = None,
    num_waves: int = 12,
    rounds: int = ROUNDS,
    on_step: Callable[[StepUpdate], None] | None = None,
) -> dict:
    """Run each mode for ``steps`` (default :data:`STEPS`) optimizer steps per round on one
    server; return the figures. ``on_step`` hears of every step of every run (progress)."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    base = _as_spec(config)
    base.run.iterations = steps or STEPS
    check_ranker_path(base, live=True)  # a bad ranker file: refused before the server starts
    out = Path(out_dir or tempfile.mkdtemp(prefix="tandem-bench-"))
    token = secrets.token_hex(8)
    server = start_server(
        0, model_dir_for(base), "127.0.0.1", free_port(), token, split_cores(1)[0], base.live.kv_cache_gib,
        base.live.max_model_len, base.cluster.generation[0].max_num_seqs, out / "logs",
    )  # fmt: skip
    try:
        wait_healthy(server, base.live.startup_timeout_s)
        log.info("actor vs raw vLLM: %d waves", num_waves)
        generation = asyncio.run(compare_generation(base, server.base_url, num_waves))
        return {**bench_modes(base, server.base_url, token, out, rounds, on_step), **generation}
    finally:
        stop_server(server)


def round_order(round_index: int) -> tuple[str, ...]:
    """The modes in round ``round_index``: :data:`MODES` rotated, so each runs in turn first."""
    k = round_index % len(MODES)
    return MODES[k:] + MODES[:k]


def bench_modes(
    base: RunSpec, url: str, token: str, out: Path, rounds: int = ROUNDS,
    on_step: Callable[[StepUpdate], None] | None = None,
) -> dict:  # fmt: skip
    """Every mode for ``base.run.iterations`` steps per round against the server at ``url``."""
    runs: list[dict[str, RunResult]] = []
    # one model for every round: the tiny model is built from run.seed, which rounds vary
    base = base.model_copy(update={"model": base.model.model_copy(update={"path": model_dir_for(base)})})  # fmt: skip
    for r in range(rounds):
        runs.append({})
        for mode in round_order(r):
            log.info("round %d/%d: %s", r + 1, rounds, mode)
            spec = override_spec(base, [f"pipeline.mode={mode}", f"run.seed={base.run.seed + r}"])
            spec.live.server_urls, spec.live.token = [url], token
            runs[-1][mode] = run_live_ranked(spec, out / f"round-{r}" / mode, on_step)
    return {**mode_figures(runs), "steps": base.run.iterations}


def mode_figures(runs: list[dict[str, RunResult]]) -> dict:
    """Samples/s per mode (all its samples over all its time), ratios to ``disagg-sync``
    overall and per round, and the update pauses; ``runs[r][mode]`` is round ``r``'s run."""
    samples = {m: sum(r[m].metrics["num_samples_trained"] for r in runs) for m in MODES}
    wall_s = {m: sum(r[m].metrics["makespan_s"] for r in runs) for m in MODES}
    totals = {m: samples[m] / wall_s[m] for m in MODES}
    per_round = [
        {m: r[m].metrics["throughput_samples_per_s"] / r["disagg-sync"].metrics[
            "throughput_samples_per_s"] for m in MODES}
        for r in runs
    ]  # fmt: skip
    pauses = {m: [p for r in runs for p in _update_pauses_s(r[m])] for m in MODES}
    inflight = pauses["pipeline"]
    every = [p for ps in pauses.values() for p in ps]
    return {
        "samples_per_s": totals,
        "ratio_to_disagg_sync": {m: totals[m] / totals["disagg-sync"] for m in MODES},
        "ratio_to_disagg_sync_per_round": per_round,
        "median_update_pause_ms": statistics.median(inflight) * 1e3 if inflight else None,
        "num_inflight_updates": len(inflight),
        "median_update_pause_all_modes_ms": statistics.median(every) * 1e3 if every else None,
        "rounds": len(runs),
    }


def _update_pauses_s(result: RunResult) -> list[float]:
    """Pauses of the weight updates after the first (the run's initial load, before any
    generation); in ``pipeline`` mode every one of them lands during generation."""
    events = result.spans_frame()
    syncs = events[
        (events["resource"] == generation_resource(0)) & (events["kind"] == "weight_sync")
    ]
    syncs = syncs.sort_values("start_s")
    return (syncs["end_s"] - syncs["start_s"]).tolist()[1:]


def main() -> None:
    import json

    print(json.dumps(bench_live()))


if __name__ == "__main__":
    main()
