"""Sim-vs-live fidelity: the comparison code on synthetic results, and one real case (live)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from helpers import write_cost_model

from experiments.fidelity import (
    FidelityPlan,
    build_report,
    case_spec,
    load_cases,
    sim_spec_for,
    trace_of,
    write_report,
)
from experiments.fidelity_compare import (
    Case,
    compare_case,
    lag_counts,
    lag_distance,
    pooled_lag_counts,
    relative_error,
    summarise,
)
from experiments.fidelity_tables import live_spread, seed_orders, seed_orders_text
from policies.records import SampleRecord, Span, SpanKind
from policies.results import RunResult
from policies.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "experiments" / "configs" / "live-tiny.yaml"


def _samples(lags: list[int], out_tokens: int = 5) -> list[SampleRecord]:
    rows = []
    for i, lag in enumerate(lags):
        it = i // 2
        rows.append(
            SampleRecord(
                sample_id=i,
                prompt_id=100 + it,
                group_id=it,
                iteration=it,
                instance_id=0,
                prompt_tokens=6,
                output_tokens=out_tokens + i,
                predicted_output_tokens=None,
                dispatch_s=float(it),
                gen_start_s=float(it),
                gen_end_s=it + 0.5,
                train_step=it + lag,
                version_start=it,
                version_end=it,
                version_trained=it + lag,
                reward=None,
            )  # fmt: skip
        )
    return rows


def _result(throughput: float, lags: list[int], mode: str = "stream-async") -> RunResult:
    spec = load_spec(CONFIG, [f"pipeline.mode={mode}"])
    metrics = {
        "throughput_samples_per_s": throughput, "generation_time_s": 0.5,
        "iteration_time_s": 1.0, "trainer_utilization": 0.4, "pipeline_bubble_s": 2.0,
        "skewness_bubble_s": 0.0, "mean_staleness": sum(lags) / len(lags),
    }  # fmt: skip
    spans = [
        Span("gen-0", SpanKind.DECODE, 0.0, 0.5, 0, 2),
        Span("trainer", SpanKind.TRAIN, 0.5, 0.9, 0, 2),
        Span("gen-0", SpanKind.DECODE, 1.0, 1.5, 1, 2),
    ]
    steps = [{"step": s, "start_s": s + 0.5, "end_s": s + 0.9} for s in range(3)]
    return RunResult(spec, metrics, _samples(lags), spans, steps)


def test_relative_error_is_sim_over_live_minus_one_and_none_without_a_base():
    assert relative_error(2.0, 2.2) == pytest.approx(0.1)
    assert relative_error(0.0, 1.0) is None
    assert relative_error(None, 1.0) is None


def test_lag_counts_and_distance():
    live = lag_counts(_result(1.0, [0, 0, 1, 1]).samples_frame())
    assert live == {0: 2, 1: 2}
    assert lag_distance(live, live) == 0.0
    assert lag_distance({0: 4}, {1: 4}) == 1.0
    assert lag_distance({0: 2, 1: 2}, {0: 4}) == pytest.approx(0.5)


def test_compare_case_gives_one_row_per_metric_plus_the_lag_distance():
    rows = compare_case("m", "d", {"throughput_samples_per_s": 2.0},
                        {"throughput_samples_per_s": 1.5}, {0: 1}, {0: 1})  # fmt: skip
    by_metric = {r["metric"]: r for r in rows}
    assert by_metric["throughput_samples_per_s"]["rel_error"] == pytest.approx(-0.25)
    assert by_metric["generation_time_s"]["rel_error"] is None
    assert by_metric["lag_tv_distance"]["rel_error"] == 0.0


def test_summary_median_max_and_rankings():
    cases = [
        Case("disagg-sync", "rr", [_result(1.0, [0, 0])], [_result(1.08, [0, 0])]),
        Case("stream-async", "rr", [_result(2.0, [1, 1])], [_result(1.7, [1, 0])]),
        Case("pipeline", "rr", [_result(1.5, [0, 1])], [_result(1.5, [0, 1])]),
    ]
    report = build_report(cases)
    s = report.summary
    assert s.median_abs_throughput_error == pytest.approx(0.08)
    assert s.max_abs_throughput_error == pytest.approx(0.15)
    assert s.rankings["rr"] == (
        ["stream-async", "pipeline", "disagg-sync"],
        ["stream-async", "pipeline", "disagg-sync"],
    )
    assert s.rankings_match and s.passes()
    swapped = report.frame.copy()
    swapped.loc[swapped["metric"] == "throughput_samples_per_s", "sim"] = [2.5, 1.0, 1.5]
    assert not summarise(swapped).rankings_match
    assert "Median |throughput error|: 8.0%" in report.markdown()


def test_trace_replays_each_group_in_order():
    frame = _result(1.0, [0, 0, 0, 0]).samples_frame().sample(frac=1, random_state=0)
    trace = trace_of(frame)
    assert list(trace["prompt_id"]) == [0, 0, 1, 1]
    assert list(trace["output_tokens"]) == [5, 6, 7, 8]


def test_sim_spec_replays_the_trace_with_the_calibrated_model(tmp_path):
    spec = sim_spec_for(load_spec(CONFIG, []), tmp_path / "t.parquet", tmp_path / "cm")
    assert spec.workload.kind == "trace"
    assert spec.sim.cost_model == f"profiled:{tmp_path / 'cm'}"


def test_the_sim_twin_trains_in_the_live_runs_micro_batches(tmp_path):
    live = load_spec(CONFIG, ["live.micro_batch_samples=6"])
    spec = sim_spec_for(live, tmp_path / "t.parquet", tmp_path / "cm")
    assert spec.cluster.trainer.num_gpus * spec.algorithm.micro_batch_per_gpu == 6


def test_write_report_writes_table_and_plots(tmp_path):
    cases = [
        Case("disagg-sync", "rr", [_result(1.0, [0, 0, 0, 0])], [_result(1.05, [0, 0, 0, 0])]),
        Case("stream-async", "rr", [_result(2.0, [1, 1, 0, 0])], [_result(1.9, [1, 0, 0, 0])]),
    ]
    write_report(cases, tmp_path, overlay_iteration=1)
    for name in ("fidelity.csv", "fidelity.md", "bars.png", "lags.png", "timeline-overlay.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    frame = pd.read_csv(tmp_path / "fidelity.csv")
    assert len(frame) == 2 * 8
    assert len(pd.read_csv(tmp_path / "repeats.csv")) == 2


def test_repeats_compare_medians_and_report_every_run_and_the_live_spread(tmp_path):
    lives = [_result(t, [1, 1]) for t in (2.0, 1.0, 1.6)]  # median 1.6
    sims = [_result(t, [1, 0]) for t in (1.9, 1.5, 1.9)]  # median 1.9
    report = build_report([Case("stream-async", "rr", lives, sims)])
    row = report.frame[report.frame["metric"] == "throughput_samples_per_s"].iloc[0]
    assert (row["live"], row["sim"]) == (1.6, 1.9)
    # each run against its own twin: errors -5 %, +50 %, +18.75 %; the median, not 1.9/1.6
    assert list(report.repeats["rel_error"]) == pytest.approx([-0.05, 0.5, 0.3 / 1.6])
    assert report.summary.max_abs_throughput_error == pytest.approx(0.3 / 1.6)
    assert live_spread(report.repeats)["live_spread"].iloc[0] == pytest.approx(1.0 / 1.6)
    text = report.markdown()
    assert "| stream-async | rr | 1 | 0 | 1 | 1.5 | +50.0% |" in text
    assert "stream-async·rr 62.5%" in text
    assert pooled_lag_counts(sims) == {0: 3, 1: 3}
    write_report([Case("stream-async", "rr", lives, sims)], tmp_path, overlay_iteration=1)
    assert len(pd.read_csv(tmp_path / "repeats.csv")) == 3


def test_a_case_needs_one_twin_per_live_run_and_repeats_are_positive():
    with pytest.raises(ValueError, match="one sim twin per live run"):
        Case("pipeline", "rr", [_result(1.0, [0])], [])
    with pytest.raises(ValueError, match="repeats"):
        FidelityPlan(("pipeline",), repeats=0)


def test_each_repeat_of_a_case_gets_its_own_seed():
    base = load_spec(CONFIG, ["run.seed=7"])
    seeds = [
        case_spec(base, "pipeline", "round-robin", "http://x", "t", r).run.seed for r in range(3)
    ]
    assert seeds == [7, 8, 9]


def test_a_live_case_prices_dispatch_with_its_twins_calibrated_model(tmp_path):
    base = load_spec(CONFIG)
    spec = case_spec(base, "pipeline", "skewness-aware", "http://x", "t", 0, tmp_path)
    assert spec.live.cost_model == str(tmp_path)
    assert case_spec(base, "pipeline", None, "http://x", "t").live.cost_model is None


@pytest.mark.parametrize("mode", ["disagg-sync", "stream-async", "pipeline"])
def test_sim_twin_of_a_sim_run_reproduces_it_exactly(tmp_path, mode):
    from experiments.fidelity import simulate_twin
    from sim.simulator import Simulation

    cost = write_cost_model(tmp_path / "cm")
    spec = load_spec(
        CONFIG, [f"pipeline.mode={mode}", f"sim.cost_model=profiled:{cost}", "run.iterations=4",
                 "algorithm.batch_size=24", "algorithm.group_size=3",
                 "workload.lognormal_median_tokens=20"],
    )  # fmt: skip
    original = Simulation(spec).run()
    twin = simulate_twin(original, tmp_path, cost)
    assert twin.metrics["throughput_samples_per_s"] == original.metrics["throughput_samples_per_s"]
    a, b = original.samples_frame(), twin.samples_frame()
    assert list(a["output_tokens"]) == list(b["output_tokens"])


def test_saved_cases_load_back_for_a_new_report(tmp_path):
    live, sim = _result(2.0, [1, 1, 0, 0]), _result(1.9, [1, 0, 0, 0])
    for repeat in (0, 1):
        live.save(tmp_path / "cases" / "stream-async-least-loaded" / f"repeat-{repeat}" / "live")
        sim.save(tmp_path / "cases" / "stream-async-least-loaded" / f"repeat-{repeat}" / "sim")
    (case,) = load_cases(tmp_path)
    assert (case.mode, case.dispatch, len(case.lives)) == ("stream-async", "least-loaded", 2)
    assert case.live.samples == live.samples and case.live.spans == live.spans
    assert case.sim.metrics == sim.metrics
    with pytest.raises(ValueError, match="not a fidelity report"):
        load_cases(tmp_path / "cases")
    shipped = tmp_path / "shipped"  # as docs/reports/fidelity-run14: the report, no runs
    shipped.mkdir()
    (shipped / "fidelity.csv").write_text("mode\n")
    with pytest.raises(ValueError, match="without its saved runs .* without --report-only"):
        load_cases(shipped)


def test_seed_orders_keep_only_pairs_every_seed_agrees_on():
    rows = [
        # seed 0: a > b > c live; seed 1: a > c > b live (b, c swap)
        ("a", 0, 30.0, 31.0), ("b", 0, 20.0, 21.0), ("c", 0, 10.0, 11.0),
        ("a", 1, 31.0, 12.0), ("b", 1, 11.0, 22.0), ("c", 1, 12.0, 11.0),
    ]  # fmt: skip
    repeats = pd.DataFrame(
        [
            {"mode": m, "dispatch": "ll", "repeat": s, "seed": s, "live": lv, "sim": sm}
            for m, s, lv, sm in rows
        ]  # fmt: skip
    )
    # (a, b): a wins live on both seeds, the sim has b ahead on seed 1 -> disagrees
    assert seed_orders(repeats, "ll") == [("a", "b", False), ("a", "c", True)]
    assert "1 of 2" in seed_orders_text(repeats)
    assert seed_orders_text(repeats[repeats["seed"] == 0].assign(repeat=0)) == ""


def _no_server(monkeypatch):
    import runtime.procs

    def refuse(*args, **kwargs):
        raise AssertionError("a server started before the plan was checked")

    monkeypatch.setattr(runtime.procs, "start_server", refuse)


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (FidelityPlan(("pipeline", "stream-asyc")), "^--modes stream-asyc: unknown name"),
        (FidelityPlan(("pipeline",), ("least-loded",)), "^--dispatch least-loded: unknown name"),
    ],
)
def test_a_bad_mode_or_dispatch_fails_before_the_server_starts(
    tmp_path, monkeypatch, plan, message
):
    from experiments.fidelity import run_fidelity

    _no_server(monkeypatch)
    plan = FidelityPlan(plan.modes, plan.dispatches, cost_model_dir=write_cost_model(tmp_path))
    with pytest.raises(ValueError, match=message) as err:
        run_fidelity(load_spec(CONFIG), plan, tmp_path / "out")
    assert "\n" not in str(err.value)


def test_a_missing_cost_model_fails_before_the_server_starts(tmp_path, monkeypatch):
    from experiments.fidelity import run_fidelity

    _no_server(monkeypatch)
    plan = FidelityPlan(("pipeline",), cost_model_dir=tmp_path / "nowhere")
    with pytest.raises(ValueError, match="^--cost-model: cost model .*nowhere"):
        run_fidelity(load_spec(CONFIG), plan, tmp_path / "out")


def _save_case(out: Path, name: str, key: str | None) -> None:
    from experiments.fidelity_plan import mark_case

    case_dir = out / "cases" / name / "repeat-0"
    _result(2.0, [1, 1, 0, 0]).save(case_dir / "live")
    _result(1.9, [1, 0, 0, 0]).save(case_dir / "sim")
    if key is not None:
        mark_case(case_dir, key)


def test_a_run_into_an_out_holding_another_runs_cases_is_refused(tmp_path, monkeypatch):
    from experiments.fidelity import run_fidelity

    _no_server(monkeypatch)
    _save_case(tmp_path, "stream-async-least-loaded", "0123456789ab")
    plan = FidelityPlan(("pipeline",), cost_model_dir=write_cost_model(tmp_path / "cm"))
    with pytest.raises(ValueError, match=r"cases holds cases of another fidelity run \(cases/"):
        run_fidelity(load_spec(CONFIG), plan, tmp_path)


def test_report_only_refuses_cases_of_different_runs(tmp_path):
    _save_case(tmp_path, "stream-async-least-loaded", "aaaaaaaaaaaa")
    _save_case(tmp_path, "pipeline-least-loaded", "bbbbbbbbbbbb")
    with pytest.raises(ValueError, match="mixes cases of different fidelity runs.*pipeline-least"):
        load_cases(tmp_path)


def test_the_overlay_uses_an_iteration_the_run_has(tmp_path):
    from experiments.fidelity_plots import overlay_iteration_of

    case = Case("disagg-sync", "rr", [_result(1.0, [0, 0, 0, 0])], [_result(1.0, [0, 0, 0, 0])])
    assert overlay_iteration_of(case, 2) == 1  # two iterations: 0 and 1
    assert overlay_iteration_of(case, 0) == 0
    write_report([case], tmp_path)  # the default (iteration 2)
    assert (tmp_path / "timeline-overlay.png").stat().st_size > 0
