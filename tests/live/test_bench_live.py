"""``tandem bench live``'s two measurements, run for real (shortened) on the shared server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from experiments.bench_live import MODES, bench_modes, compare_generation
from policies.spec import load_spec

pytestmark = pytest.mark.live

CONFIG = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "live-tiny.yaml"


def _spec():
    overrides = ["run.iterations=2", "algorithm.batch_size=8", "workload.max_output_tokens=32"]
    return load_spec(CONFIG, overrides)


def test_every_mode_runs_against_the_server_and_pipeline_updates_in_flight(server, token, tmp_path):
    figures = bench_modes(_spec(), server, token, tmp_path, rounds=1)
    assert set(figures["samples_per_s"]) == set(MODES)
    assert all(rate > 0 for rate in figures["samples_per_s"].values())
    assert figures["ratio_to_disagg_sync"]["disagg-sync"] == pytest.approx(1.0)
    assert figures["num_inflight_updates"] >= 1 and figures["median_update_pause_ms"] > 0
    for mode in MODES:
        assert (tmp_path / "round-0" / mode / "samples.parquet").exists(), mode


def test_actor_and_raw_vllm_generate_the_same_tokens_from_the_same_seeds(server):
    figures = asyncio.run(compare_generation(_spec(), server, num_waves=2))
    assert figures["actor_output_tokens"] == figures["raw_output_tokens"] > 0
    assert figures["actor_over_raw"] > 0
