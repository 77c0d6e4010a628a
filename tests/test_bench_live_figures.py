"""``tandem bench live``'s arithmetic: rounds rotate the modes, totals pool every round."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.bench_live import MODES, mode_figures, round_order
from policies.records import Span, SpanKind
from policies.results import RunResult
from policies.spec import load_spec

CONFIG = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "live-tiny.yaml"


def _run(samples: int, makespan_s: float, pauses_s: list[float]) -> RunResult:
    spans = [Span("gen-0", SpanKind.WEIGHT_SYNC, 0.0, 0.5, 0, 0)]  # the initial load
    spans += [Span("gen-0", SpanKind.WEIGHT_SYNC, 1.0 + i, 1.0 + i + p, i + 1, 0)
              for i, p in enumerate(pauses_s)]  # fmt: skip
    metrics = {"num_samples_trained": samples, "makespan_s": makespan_s,
               "throughput_samples_per_s": samples / makespan_s}  # fmt: skip
    return RunResult(load_spec(CONFIG), metrics, [], spans, [])


def test_each_mode_runs_first_in_one_round():
    firsts = [round_order(r)[0] for r in range(len(MODES))]
    assert sorted(firsts) == sorted(MODES)
    assert all(sorted(round_order(r)) == sorted(MODES) for r in range(7))


def test_figures_pool_every_rounds_samples_and_time():
    rounds = [
        {"disagg-sync": _run(64, 2.0, [0.02]), "stream-sync": _run(64, 1.6, [0.03]),
         "stream-async": _run(64, 1.0, [0.04]), "pipeline": _run(64, 1.0, [0.01, 0.05])},
        {"disagg-sync": _run(64, 4.0, [0.02]), "stream-sync": _run(64, 2.0, [0.03]),
         "stream-async": _run(64, 3.0, [0.04]), "pipeline": _run(64, 2.0, [0.03])},
    ]  # fmt: skip
    fig = mode_figures(rounds)
    assert fig["samples_per_s"]["disagg-sync"] == pytest.approx(128 / 6.0)
    assert fig["ratio_to_disagg_sync"]["stream-async"] == pytest.approx(6.0 / 4.0)
    assert fig["ratio_to_disagg_sync"]["pipeline"] == pytest.approx(2.0)
    assert fig["ratio_to_disagg_sync_per_round"][1]["stream-async"] == pytest.approx(4.0 / 3.0)
    assert fig["median_update_pause_ms"] == pytest.approx(30.0)  # pipeline: 10, 50, 30 ms
    assert fig["num_inflight_updates"] == 3 and fig["rounds"] == 2


def test_every_round_trains_the_model_the_server_serves(monkeypatch, tmp_path):
    """Rounds vary run.seed, and the tiny model is built from run.seed: the rounds must
    keep the one model the shared server was started with."""
    import runtime.launcher
    from experiments import bench_live

    built, paths = [], []
    monkeypatch.setattr(bench_live, "model_dir_for", lambda spec: built.append(spec.run.seed) or "/m")  # fmt: skip

    def fake_run(spec, out_dir, length_predictor=None, force_new_spec=False, **_):
        paths.append((spec.run.seed, spec.model.path))
        return _run(16, 2.0, [0.01])

    monkeypatch.setattr(runtime.launcher, "run_live", fake_run)
    base = load_spec(CONFIG)
    bench_live.bench_modes(base, "http://127.0.0.1:1", "t", tmp_path, rounds=2)
    assert built == [base.run.seed]
    assert {seed for seed, _ in paths} == {base.run.seed, base.run.seed + 1}
    assert {path for _, path in paths} == {"/m"}
