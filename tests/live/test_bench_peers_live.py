"""``tandem bench peers``'s TRL side, run for real: TRL's GRPOTrainer on the tiny model
for a warm-up and two timed steps at batch 8, in its own process, as the benchmark runs it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from experiments.bench_peers import TRL, PeerBenchConfig, run_system
from experiments.peers_rates import rates
from policies.spec import load_spec

pytestmark = pytest.mark.live

CONFIG = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "live-tiny.yaml"


def test_trl_grpo_trainer_runs_on_the_tiny_model_and_reports_its_steps(model_dir, tmp_path):
    overrides = [
        f"model.path={model_dir}",
        "algorithm.batch_size=8",
        "workload.max_output_tokens=32",
    ]
    spec = load_spec(CONFIG, overrides)
    config = PeerBenchConfig(spec, tmp_path, steps=2, rounds=1, modes=("disagg-sync",))
    series = run_system(config, spec, tmp_path / "spec.yaml", TRL, tmp_path / TRL)
    result = json.loads((tmp_path / TRL / "result.json").read_text())
    major, minor = (int(v) for v in result["versions"]["trl"].split(".")[:2])
    assert (major, minor) >= (1, 16) and result["torch_threads"] == 2
    assert (result["bf16"], result["gradient_checkpointing"]) == (False, False)  # as tandem
    assert [s.num_samples for s in series.steps] == [8, 8]  # 2 prompts x 4, per timed step
    assert all(0 < s.completion_tokens <= 8 * 32 for s in series.steps)
    r = rates(series)
    assert r.samples_per_s > 0 and r.tokens_per_s > 0 and r.steady_samples_per_s > 0
    assert r.num_samples == 16
    # within what the cores could give over the timed steps; the step clock and
    # process_time are read a moment apart, which over two ~50 ms steps (CI: 0.105 s,
    # 13.22 against 13.13 ms) needs a few milliseconds of slack
    slack_s = 0.01
    assert 0 < r.cpu_ms_per_sample <= os.cpu_count() * 1000 * (r.wall_s + slack_s) / r.num_samples
    assert 0.0 <= r.late_reward <= 1.0 and 0.0 <= r.mean_reward <= 1.0  # the task reward
