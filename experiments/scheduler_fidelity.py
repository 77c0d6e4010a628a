"""``tandem scheduler-trace``: the simulator's engine against real vLLM, step by step.

One vLLM-CPU engine with the tiny model and a deliberately small KV cache (so it must
preempt) runs a skewed trace of fixed output lengths, all submitted at once; the
simulator's scheduler replays the same trace with the same limits. Compared per case:
engine steps, preemptions and the mean running batch (requests per step), and whether the
two step sequences are identical. Writes ``OUT/scheduler_trace.json`` (summary) and
``OUT/steps-<case>.csv`` (both step sequences side by side).
"""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from policies.records import SchedulerStep, TraceRequest
from policies.results import write_atomic
from sim.replay import limits_from_engine_args, replay_schedule

LIMITS = {  # tight on purpose: 39 blocks of 32 tokens for up to 16 sequences
    "max_num_seqs": 16, "max_num_batched_tokens": 256, "block_size": 32,
    "num_gpu_blocks_override": 40, "enable_prefix_caching": True,
}  # fmt: skip
CASES = {"fcfs": "fcfs", "priority-lpt": "priority"}  # case -> vLLM scheduling policy


def skewed_trace(
    num_groups: int = 12, group_size: int = 4, seed: int = 0, lpt: bool = False
) -> list[TraceRequest]:
    """GRPO-like groups (one prompt of 40-160 tokens each), lognormal output lengths with
    a long tail (median ~33, capped at 300); ``lpt``: priority = minus the length."""
    rng = random.Random(seed)
    trace = []
    for group in range(num_groups):
        prompt = rng.randint(40, 160)
        for _ in range(group_size):
            length = int(min(300, max(4, rng.lognormvariate(3.5, 0.9))))
            trace.append(TraceRequest(prompt, length, group, -float(length) if lpt else 0.0))
    return trace


@dataclass(slots=True, frozen=True)
class CaseComparison:
    case: str
    vllm_steps: int
    sim_steps: int
    vllm_preemptions: int
    sim_preemptions: int
    vllm_mean_running: float
    sim_mean_running: float
    identical: bool

    def relative_errors(self) -> dict[str, float]:
        def rel(sim: float, real: float) -> float:
            return abs(sim - real) / real if real else float(sim != real)

        return {
            "steps": rel(self.sim_steps, self.vllm_steps),
            "preemptions": rel(self.sim_preemptions, self.vllm_preemptions),
            "mean_running": rel(self.sim_mean_running, self.vllm_mean_running),
        }


def _mean_running(steps: list[SchedulerStep]) -> float:
    return sum(s.num_requests for s in steps) / len(steps)


def compare(case: str, real: list[SchedulerStep], sim: list[SchedulerStep]) -> CaseComparison:
    return CaseComparison(
        case, len(real), len(sim), sum(s.num_preempted for s in real),
        sum(s.num_preempted for s in sim), _mean_running(real), _mean_running(sim), real == sim,
    )  # fmt: skip


def record_vllm(
    model_dir: str, limits: dict[str, Any], trace: list[TraceRequest]
) -> list[SchedulerStep]:
    """``runtime.engine_trace`` in a fresh process (vLLM's engine in that process)."""
    with tempfile.TemporaryDirectory() as tmp:
        request, out = Path(tmp) / "request.json", Path(tmp) / "steps.json"
        body = {
            "model_dir": model_dir,
            "limits": limits,
            "trace": [dataclasses.asdict(r) for r in trace],
        }
        request.write_text(json.dumps(body))
        cmd = [sys.executable, "-m", "runtime.engine_trace", str(request), str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(
                f"runtime.engine_trace failed ({done.returncode}): {done.stderr[-2000:]}"
            )
        return [SchedulerStep(**s) for s in json.loads(out.read_text())]


def run_scheduler_trace(
    model_dir: str,
    out_dir: Path,
    seed: int = 0,
    on_case: Callable[[str, int, int], None] | None = None,
) -> list[CaseComparison]:
    """Each case's vLLM steps against the simulated engine's (``on_case`` hears of each
    case as it starts: name, index, count)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for index, (case, policy) in enumerate(CASES.items()):
        if on_case is not None:
            on_case(case, index, len(CASES))
        limits = {**LIMITS, "scheduling_policy": policy}
        trace = skewed_trace(seed=seed, lpt=policy == "priority")
        real = record_vllm(model_dir, limits, trace)
        sim = replay_schedule(trace, limits_from_engine_args(limits))
        results.append(compare(case, real, sim))
        frame = pd.concat(
            [pd.DataFrame([dataclasses.asdict(s) for s in steps]).add_prefix(f"{who}_")
             for who, steps in (("vllm", real), ("sim", sim))], axis=1,
        )  # fmt: skip
        frame.to_csv(out_dir / f"steps-{case}.csv", index_label="step")
    summary = {
        "limits": LIMITS, "seed": seed,
        "cases": [{**dataclasses.asdict(r), "relative_errors": r.relative_errors()} for r in results],
    }  # fmt: skip
    write_atomic(out_dir / "scheduler_trace.json", json.dumps(summary, indent=2).encode())
    return results
