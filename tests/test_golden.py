"""Golden back-tests: the metrics of two small scenarios, checked in and compared exactly.

A refactor must keep these bit-identical. When a change is *meant* to move them (a new
cost-model default, a fixed bug), regenerate the files, look at the diff, and commit it:

    REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden.py
    # or: .venv/bin/python tests/test_golden.py

Floats are compared with ``==`` (JSON keeps every bit of a double); ``sim_wall_s`` is left
out since it is wall-clock time.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.specs import config_path  # noqa: E402
from policies.spec import load_spec  # noqa: E402
from sim.simulator import Simulation  # noqa: E402

GOLDEN_DIR = Path(__file__).parent / "golden"

SCENARIOS: dict[str, tuple[str, list[str]]] = {
    # StreamRL-7B (PPO, histogram lengths, balanced allocation) in stream-async, scaled down
    "streamrl-7b-stream-async": (
        "streamrl-7b",
        [
            "run.iterations=3",
            "algorithm.batch_size=64",
            "workload.max_output_tokens=2000",
            "pipeline.mode=stream-async",
        ],
    ),
    # PipelineRL-style: heterogeneous, cross-datacenter generation, lag 2, abort-resubmit
    "pipeline-hetero-lag2": (
        "streamrl-7b",
        [
            "run.iterations=3",
            "run.seed=7",
            "algorithm.name=grpo",
            "algorithm.batch_size=32",
            "algorithm.group_size=4",
            "cluster.generation=[{hardware: H800, num_gpus: 2, datacenter: dc0, max_num_seqs: 8},"
            " {hardware: H20, num_gpus: 2, datacenter: dc1, max_num_seqs: 8}]",
            "cluster.trainer.num_gpus=4",
            "workload.kind=lognormal",
            "workload.max_output_tokens=1500",
            "workload.lognormal_median_tokens=300",
            "pipeline.mode=pipeline",
            "pipeline.max_lag=2",
            "pipeline.inflight=abort-resubmit",
            "policies.allocation=fixed",
            "policies.dispatch=least-loaded",
            "policies.scheduling=lpt",
            "policies.length_predictor=noisy-oracle",
        ],
    ),
}


def compute(name: str) -> dict:
    config, overrides = SCENARIOS[name]
    result = Simulation(load_spec(config_path(config), overrides)).run()
    metrics = {k: v for k, v in result.metrics.items() if k != "sim_wall_s"}
    return {"config": config, "overrides": overrides, "metrics": metrics, "steps": result.steps}


def regenerate() -> list[Path]:
    GOLDEN_DIR.mkdir(exist_ok=True)
    paths = []
    for name in SCENARIOS:
        path = GOLDEN_DIR / f"{name}.json"
        path.write_text(json.dumps(compute(name), indent=2) + "\n")
        paths.append(path)
    return paths


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden_metrics_are_bit_identical(name):
    if os.environ.get("REGEN_GOLDEN") == "1":
        regenerate()
    path = GOLDEN_DIR / f"{name}.json"
    golden = json.loads(path.read_text())
    got = json.loads(json.dumps(compute(name)))  # same JSON types as the file
    assert got["overrides"] == golden["overrides"], "scenario changed: regenerate the golden file"
    assert got["metrics"].keys() == golden["metrics"].keys()
    for key, value in golden["metrics"].items():
        assert got["metrics"][key] == value, f"{key}: {got['metrics'][key]!r} != golden {value!r}"
    assert got["steps"] == golden["steps"]


def test_golden_scenarios_are_not_trivial():
    for name in SCENARIOS:
        golden = json.loads((GOLDEN_DIR / f"{name}.json").read_text())
        m = golden["metrics"]
        assert m["num_samples_trained"] == len(golden["steps"]) * golden["steps"][0]["num_samples"]
        assert m["throughput_samples_per_s"] > 0
        assert 0 < m["generation_utilization"] <= 1


if __name__ == "__main__":
    for p in regenerate():
        print(f"wrote {p}")
