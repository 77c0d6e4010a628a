"""``tandem policy-effects``: what dispatch and instance count save, live and in the sim.

Generation only (no trainer): a skewed workload of fixed output lengths (``ignore_eos``,
per-request ``max_tokens``; most answers short, a fifth 10-50x longer), all dispatched at
once, is generated

* on two vLLM-CPU servers, one core each, with ``random``, ``least-loaded`` and
  ``skewness-aware`` + LPT dispatch (oracle lengths), and
* on one server (``least-loaded``: everything on it),

live and in the simulator (the same assignments, engines with the servers' limits and a
cost model calibrated on a ``tandem profile`` of this machine). Savings are makespan
ratios: each policy against ``random``, two servers against one. Cases alternate within
every seed so slow drifts of the host hit all of them alike.

The host: each server's engine is pinned to its own core, its HTTP frontend (and this
client) run on any. With one server the frontend has the other core to itself; with
two, every core runs an engine and the frontends' CPU comes out of the engines' time.
The simulated engines contend (``decode_slowdown``) while both have work, by the share
this takes: :func:`host_overhead` measures the frontend and client CPU per engine CPU
second on one server's burst (from /proc), :func:`shared_host_slowdown` turns it into
the slowdown of engines sharing the cores.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from policies.dispatch import DISPATCH
from policies.protocols import CostModel, Device
from policies.records import InstanceView, Request
from policies.scheduling import SCHEDULING
from runtime.tasks import TaskSet


@dataclass(slots=True, frozen=True)
class EffectCase:
    name: str
    num_servers: int
    dispatch: str
    scheduling: str


CASES = (
    EffectCase("random", 2, "random", "fcfs"),
    EffectCase("least-loaded", 2, "least-loaded", "fcfs"),
    EffectCase("skewness-aware+lpt", 2, "skewness-aware", "lpt"),
    EffectCase("one-server", 1, "least-loaded", "fcfs"),
)


@dataclass(slots=True, frozen=True)
class ServerLimits:
    """What the engines of the experiment allow (the live servers' vLLM settings)."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048  # vLLM's CPU default
    block_size: int = 128  # vLLM's CPU default
    max_model_len: int = 512


def skewed_requests(
    seed: int, num_requests: int = 96, long_fraction: float = 0.2, max_model_len: int = 512
) -> list[Request]:
    """Task prompts with fixed lengths: short 8-40 tokens, a ``long_fraction`` 160-400."""
    tasks = TaskSet(seed, max(256, num_requests), 128)
    rng = random.Random(seed)
    requests = []
    for i in range(num_requests):
        prompt = tasks[i]
        long = rng.random() < long_fraction
        length = rng.randint(160, 400) if long else rng.randint(8, 40)
        length = min(length, max_model_len - prompt.prompt_tokens - 1)
        requests.append(
            Request(
                i, prompt.prompt_id, i, 0, prompt.prompt_tokens, length, float(length), prompt.text
            )
        )
    return requests


def views(num_servers: int, limits: ServerLimits) -> list[InstanceView]:
    return [
        InstanceView(
            i, "cpu", 1, "dc0", limits.max_num_seqs, limits.max_num_seqs * limits.max_model_len
        )
        for i in range(num_servers)
    ]


def assign(
    case: EffectCase, requests: Sequence[Request], limits: ServerLimits, cost: CostModel, seed: int
) -> dict[int, list[Request]]:
    """The case's dispatch of every request at once: instance id -> its requests."""
    policy = DISPATCH.create_from(
        case.dispatch,
        {"rng": np.random.default_rng(seed), "cost_model": cost, "objective": "sum",
         "long_tail_fraction": 0.2},
    )  # fmt: skip
    out: dict[int, list[Request]] = {v.instance_id: [] for v in views(case.num_servers, limits)}
    for r, target in zip(requests, policy.assign(requests, views(case.num_servers, limits))):
        out[target].append(r)
    return out


def priorities(case: EffectCase, requests: Sequence[Request]) -> list[int]:
    """vLLM priorities (smaller first) of the case's scheduling policy."""
    policy = SCHEDULING.create_from(case.scheduling, {})
    return [int(round(policy.priority(r))) for r in requests]


# -- live ---------------------------------------------------------------------------------


async def live_makespan_s(
    urls: Sequence[str], case: EffectCase, assignment: dict[int, list[Request]]
) -> float:
    """Generate ``assignment`` on the servers at ``urls``; seconds to the last completion."""
    from runtime.gen_client import GenerationClient

    clients = [GenerationClient(i, urls[i], 1.0) for i in assignment]
    start = time.perf_counter()
    ends: list[float] = []

    async def one(client: GenerationClient, requests: list[Request]) -> None:
        seeds = [1000 + r.sample_id for r in requests]
        stream = client.stream(
            requests, 0.0, time.perf_counter, priorities(case, requests), seeds, ignore_eos=True
        )
        async for out in stream:
            if out.completion.output_tokens != out.completion.request.max_tokens:
                raise RuntimeError(f"sample {out.completion.sample_id}: length not as asked")
            ends.append(time.perf_counter())

    try:
        await asyncio.gather(
            *(one(c, assignment[c.instance_id]) for c in clients if assignment[c.instance_id])
        )
    finally:
        for c in clients:
            await c.aclose()
    return max(ends) - start


# -- sim ----------------------------------------------------------------------------------


def sim_makespan_s(
    case: EffectCase, assignment: dict[int, list[Request]], limits: ServerLimits, cost
) -> float:
    """The same assignment on simulated engines with the servers' limits."""
    from sim.generation import simulate_generation
    from sim.sequence import NULL_BLOCKS, EngineLimits

    device = Device("cpu", 1)
    engine = EngineLimits(
        max_num_seqs=limits.max_num_seqs, max_num_batched_tokens=limits.max_num_batched_tokens,
        block_size=limits.block_size,
        num_blocks=cost.kv_capacity_tokens(device) // limits.block_size - NULL_BLOCKS,
    )  # fmt: skip
    scheduling = SCHEDULING.create_from(case.scheduling, {})
    result = simulate_generation(
        assignment, engine, cost, device, scheduling, lambda r: r.max_tokens, shared_host=True
    )
    return result.makespan_s


# -- the experiment -----------------------------------------------------------------------


def measure(
    urls: Sequence[str],
    cost,
    seeds: Sequence[int],
    limits: ServerLimits,
    num_requests: int = 96,
    repeats: int = 3,
    progress: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """One row per (seed, case): the median live makespan of ``repeats`` runs (the cases
    alternate, in a rotated order per repeat) and the simulated one. One unmeasured case
    first: a server's first batches after start-up run slower. ``progress`` hears of each
    live run as it ends (:func:`num_live_runs` of them)."""
    tick = progress or (lambda _: None)
    rows = []
    for seed in seeds:
        requests = skewed_requests(seed, num_requests, max_model_len=limits.max_model_len)
        assignments = {c.name: assign(c, requests, limits, cost, seed) for c in CASES}
        if seed == seeds[0]:
            asyncio.run(live_makespan_s(urls, CASES[0], assignments[CASES[0].name]))
            tick("warm-up batch")
        live: dict[str, list[float]] = {c.name: [] for c in CASES}
        for k in range(repeats):
            for case in CASES[k % len(CASES) :] + CASES[: k % len(CASES)]:
                live[case.name].append(
                    asyncio.run(live_makespan_s(urls, case, assignments[case.name]))
                )
                tick(f"seed {seed}, repeat {k + 1}/{repeats}: {case.name}")
        for case in CASES:
            assignment = assignments[case.name]
            rows.append({
                "seed": seed, "case": case.name, "live_makespan_s": float(np.median(live[case.name])),
                "live_runs_s": [round(x, 4) for x in live[case.name]],
                "sim_makespan_s": sim_makespan_s(case, assignment, limits, cost),
                "requests_per_server": [len(v) for v in assignment.values()],
            })  # fmt: skip
    return pd.DataFrame(rows)


def savings(frame: pd.DataFrame) -> pd.DataFrame:
    """Per seed: each policy's saving against random, two servers' against one (fractions)."""
    out = []
    for seed, g in frame.groupby("seed"):
        by = g.set_index("case")
        pairs = [(c.name, "random") for c in CASES[1:3]] + [("least-loaded", "one-server")]
        for case, base in pairs:
            row = {"seed": seed, "saving": f"{case} vs {base}"}
            for side in ("live", "sim"):
                row[side] = (
                    1.0 - by.loc[case, f"{side}_makespan_s"] / by.loc[base, f"{side}_makespan_s"]
                )
            out.append(row)
    result = pd.DataFrame(out)
    result["error_pp"] = 100 * (result["sim"] - result["live"]).abs()
    return result


def write_report(frame: pd.DataFrame, out: Path) -> str:
    from policies.results import write_atomic

    out.mkdir(parents=True, exist_ok=True)
    s = savings(frame)
    write_atomic(out / "makespans.csv", frame.to_csv(index=False).encode())
    write_atomic(out / "savings.csv", s.to_csv(index=False).encode())
    mean = s.groupby("saving")[["live", "sim", "error_pp"]].mean()
    live_order = list(mean.sort_values("live").index)
    sim_order = list(mean.sort_values("sim").index)
    lines = [
        "| saving | live (mean) | sim (mean) | |sim − live| (pp, mean / max) |",
        "|---|---:|---:|---:|",
    ]
    for name, row in mean.iterrows():
        worst = s[s["saving"] == name]["error_pp"].max()
        lines.append(
            f"| {name} | {row['live']:.1%} | {row['sim']:.1%} | {row['error_pp']:.1f} / {worst:.1f} |"
        )
    lines.append("")
    lines.append(
        f"order of the savings — live: {live_order}; sim: {sim_order}; same: {live_order == sim_order}"
    )
    text = "\n".join(lines) + "\n"
    write_atomic(out / "report.md", text.encode())
    return text


async def host_overhead(server, num_requests: int = 64, max_tokens: int = 128) -> float:
    """CPU that generation takes beyond its pinned engine, per engine CPU second: the
    server's frontend and this client (which runs the experiment) over the engine
    processes, measured on a burst of one server alone."""
    from runtime.host_cpu import cpu_seconds, server_cpu
    from runtime.profile_bursts import prompt_slice, route_burst_s

    prompts = prompt_slice(TaskSet(0, 256, 128), num_requests, 7)
    before, client = server_cpu(server.proc.pid), cpu_seconds(os.getpid())
    await route_burst_s(server.base_url, prompts, max_tokens, 1.0, ignore_eos=True)
    used = server_cpu(server.proc.pid) - before
    return (used.frontend_s + cpu_seconds(os.getpid()) - client) / used.engine_s


def shared_host_slowdown(num_engines: int, overhead: float, num_cores: int) -> float:
    """How much slower each engine runs while ``num_engines`` generate on ``num_cores``:
    each takes ``1 + overhead`` cores (its pinned engine, plus its frontend and the
    client on any core), so beyond the host's cores all of it shares them (first
    principles: CPU time is conserved; the host scheduler shares it evenly)."""
    return max(1.0, num_engines * (1.0 + overhead) / num_cores)


def with_slowdown(cost, slowdown: float):
    """``cost`` whose contended decode runs ``slowdown`` times slower (never faster)."""
    from policies.calibrated import OperatorFit

    fit = OperatorFit(("1",), (max(1.0, slowdown),), 0.0)
    return dataclasses.replace(cost, fits={**cost.fits, "decode_slowdown": fit})


def num_live_runs(num_seeds: int, repeats: int = 3) -> int:
    """The progress ticks of :func:`run_policy_effects`: servers up, warm-up, the first
    seed's unmeasured batch, and every measured one."""
    return 3 + num_seeds * repeats * len(CASES)


def run_policy_effects(
    cost_model_dir: Path,
    out: Path,
    seeds: Sequence[int],
    num_requests: int = 96,
    progress: Callable[[str], None] | None = None,
) -> str:
    """Start two servers (engine cores 0 and 1), warm them up, measure, report. The
    servers' logs are kept (in a temporary directory) only where the measuring failed."""
    import shutil
    import tempfile

    from policies.calibrated import cost_model_path
    from runtime.model import ensure_tiny_model
    from runtime.procs import free_port, start_server, stop_server, wait_healthy
    from sim.calibrated import CalibratedCostModel

    cost = CalibratedCostModel.load(cost_model_path(cost_model_dir, "--cost-model"))
    limits = ServerLimits()
    model_dir = str(ensure_tiny_model(0))
    logs = Path(tempfile.mkdtemp(prefix="policy-effects-"))
    servers, keep_logs = [], False
    try:
        for i in range(2):
            servers.append(start_server(
                i, model_dir, "127.0.0.1", free_port(), "policy-effects", [i], 1.0,
                limits.max_model_len, limits.max_num_seqs, logs,
            ))  # fmt: skip
        for s in servers:
            wait_healthy(s)
        tick = progress or (lambda _: None)
        tick("servers up")
        asyncio.run(_warm([s.base_url for s in servers]))
        tick("warm-up")
        urls = [s.base_url for s in servers]
        overhead = asyncio.run(host_overhead(servers[0]))
        slowdown = shared_host_slowdown(len(servers), overhead, len(os.sched_getaffinity(0)))
        cost = with_slowdown(cost, slowdown)
        frame = measure(urls, cost, seeds, limits, num_requests, progress=progress)
        frame["host_overhead"], frame["shared_host_slowdown"] = overhead, slowdown
    except Exception:
        keep_logs = True  # for what failed
        raise
    finally:
        for s in servers:
            stop_server(s)
        if not keep_logs:  # finished, or Ctrl-C / SIGTERM: nothing to look into
            shutil.rmtree(logs, ignore_errors=True)
    return write_report(frame, out)


async def _warm(urls: Sequence[str]) -> None:
    """Each server's first batches run slower: a warm-up batch on each before measuring."""
    import httpx

    from runtime.http_pool import POOL_LIMITS
    from runtime.profile_bursts import warm_up

    for url in urls:
        async with httpx.AsyncClient(base_url=url, timeout=600.0, limits=POOL_LIMITS) as http:
            await warm_up(http, TaskSet(0, 256, 128), 1.0)
