"""``tandem bench sim``: simulator speed, in simulated samples per wall-clock second."""

from __future__ import annotations

import time
from typing import Any

from experiments.ranker_quality import RANKER_METRICS
from experiments.runs import check_run, simulate
from policies.modes import MODES
from policies.spec import RunSpec, override_spec


def bench_sim(spec: RunSpec, iterations: int = 10, ratio_iterations: int = 1) -> dict[str, Any]:
    """Every mode for ``iterations``; fast-forward vs step-by-step on ``ratio_iterations``.
    A spec the simulator (or its ranker file) refuses is refused before any mode runs;
    with ``length_predictor: ranker`` each mode says where its ranker came from and how
    well it ranked (``ranker_*``, as in a run's metrics.json)."""
    for mode in MODES.names():
        check_run(_with(spec, mode, iterations))
    out: dict[str, Any] = {"spec": spec.run.name, "iterations": iterations, "modes": {}}
    for mode in MODES.names():
        s = _with(spec, mode, iterations)
        t0 = time.perf_counter()
        result = simulate(s)
        wall = time.perf_counter() - t0
        out["modes"][mode] = {
            "wall_s": round(wall, 3),
            "simulated_samples_per_wall_s": round(result.metrics["num_samples_trained"] / wall, 1),
            "throughput_samples_per_s": round(result.metrics["throughput_samples_per_s"], 4),
            **{k: result.metrics[k] for k in RANKER_METRICS if k in result.metrics},
        }
    ratio_spec = _with(spec, "stream-sync", ratio_iterations)
    walls = {}
    for ff in (True, False):
        t0 = time.perf_counter()
        simulate(ratio_spec, fast_forward=ff)
        walls[ff] = time.perf_counter() - t0
    out["fast_forward_speedup"] = round(walls[False] / walls[True], 1)
    out["fast_forward_scenario"] = f"{spec.run.name}, stream-sync, {ratio_iterations} iteration(s)"
    return out


def _with(spec: RunSpec, mode: str, iterations: int) -> RunSpec:
    return override_spec(spec, [f"pipeline.mode={mode}", f"run.iterations={iterations}"])
