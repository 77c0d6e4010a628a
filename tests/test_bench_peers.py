"""``tandem bench peers`` without running anything: round rotation, rejection of rounds
disturbed by other load, the rates, the TRL dataset and reward wiring, the summary."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from experiments import bench_peers as bp
from experiments.bench_peers import TRL, PeerBenchConfig, RoundResult, SystemRun, rotated
from experiments.peers_load import (
    CpuSnapshot,
    RunLoad,
    disturbance,
    load_between,
    parse_host_busy_s,
)
from experiments.peers_rates import StepPoint, StepSeries, rates
from experiments.peers_report import TABLE_HEADER, csv_rows, summarize, table_rows
from experiments.peers_tandem import read_run, tandem_command
from experiments.peers_trl import TaskReward, TrlJob, dataset_rows, series_of, step_prompt_ids
from policies.spec import load_spec, override_spec
from runtime.tasks import VOCAB, TaskPromptSource, TaskSet, completion_text

CONFIG = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "live-tiny.yaml"


def _config(tmp_path, modes=("disagg-sync", "pipeline"), rounds=2, max_reruns=2):
    spec = override_spec(load_spec(CONFIG), ["model.path=/nonexistent/model"])
    return PeerBenchConfig(spec, tmp_path, steps=3, rounds=rounds, modes=modes,
                           max_reruns=max_reruns)  # fmt: skip


def _series(*points: tuple, start_s=0.0, end_s=None) -> StepSeries:
    steps = tuple(StepPoint(*p) for p in points)
    return StepSeries(start_s, end_s if end_s is not None else steps[-1].end_s, steps)


# --- rounds -------------------------------------------------------------------------


def test_each_round_rotates_the_order_so_every_system_runs_first_in_turn():
    systems = (TRL, "disagg-sync", "pipeline")
    assert [rotated(systems, a) for a in range(4)] == [
        (TRL, "disagg-sync", "pipeline"),
        ("disagg-sync", "pipeline", TRL),
        ("pipeline", TRL, "disagg-sync"),
        (TRL, "disagg-sync", "pipeline"),
    ]


def _scripted(monkeypatch, other_s_per_run: list[float]):
    """Every run takes 10 s of wall and 5 CPU s of our own; other load as scripted."""
    runs: list[tuple[str, int]] = []
    clock = {"t": 0.0, "host": 0.0, "own": 0.0}
    script = iter(other_s_per_run)
    ends = []

    def snapshot():
        if len(ends) % 2:  # the end of a run
            clock["t"] += 10.0
            clock["own"] += 5.0
            clock["host"] += 5.0 + next(script)
        ends.append(1)
        return CpuSnapshot(clock["t"], clock["host"], clock["own"])

    def run_system(config, spec, spec_path, system, out):
        runs.append((system, spec.run.seed))
        return _series((1.0, 4, 40), (2.0, 4, 40))

    monkeypatch.setattr(bp, "become_subreaper", lambda: True)  # not pytest's whole session
    monkeypatch.setattr(bp, "reap_orphans", lambda: 0)
    monkeypatch.setattr(bp, "snapshot", snapshot)
    monkeypatch.setattr(bp, "run_system", run_system)
    monkeypatch.setattr(bp.os, "cpu_count", lambda: 2)
    return runs


def test_a_round_disturbed_by_other_load_is_rejected_and_run_again(tmp_path, monkeypatch):
    # three systems a round; round 1's second run lost 8 CPU s of 20 (40 %) to others
    runs = _scripted(monkeypatch, [0.0, 8.0] + [0.5] * 6)
    results = bp.bench_peers(_config(tmp_path))
    assert [r.attempt for r in results] == [0, 1, 2]
    assert results[0].rejected is not None and results[0].rejected.startswith("disagg-sync:")
    assert "40%" in results[0].rejected
    assert [r.rejected for r in results[1:]] == [None, None]  # 0.5 CPU s of 20: 2.5 %
    # the rejected round stopped at its disturbed run; the others ran every system
    assert [seed for _, seed in runs] == [0] * 2 + [1] * 3 + [2] * 3
    assert [s for s, _ in runs[2:5]] == ["disagg-sync", "pipeline", TRL]  # rotated by 1
    assert (tmp_path / "round-1" / "spec.yaml").exists()


def test_reruns_are_bounded_and_an_all_rejected_benchmark_says_so(tmp_path, monkeypatch):
    _scripted(monkeypatch, [10.0] * 3)
    config = _config(tmp_path, rounds=2, max_reruns=1)
    results = bp.bench_peers(config)
    assert len(results) == 3 and all(r.rejected for r in results)
    summary = summarize(config, results)
    assert summary["rounds_accepted"] == 0 and summary["accepted_only"] is False
    assert [r["round"] for r in summary["rounds_rejected"]] == [1, 2, 3]


def test_other_load_is_host_busy_time_less_our_own_over_the_capacity():
    proc_stat = "cpu  100 20 30 1000 50 5 5 40 0 0\ncpu0 50 10 15 500 25 2 3 20 0 0\n"
    assert parse_host_busy_s(proc_stat, clock_ticks=100) == pytest.approx(2.0)  # no idle/iowait
    with pytest.raises(ValueError):
        parse_host_busy_s("intr 1 2 3\n", 100)
    load = load_between(CpuSnapshot(1.0, 100.0, 10.0), CpuSnapshot(11.0, 118.0, 25.0), 2)
    assert (load.wall_s, load.other_s, load.other_share) == (10.0, 3.0, pytest.approx(0.15))
    assert disturbance(load, max_other_share=0.2) is None
    assert "15%" in disturbance(load, max_other_share=0.1)
    # our own time can exceed what /proc/stat counted (tick rounding): never negative
    assert RunLoad(10.0, 5.0, 6.0, 2).other_s == 0.0


# --- rates --------------------------------------------------------------------------


def test_whole_run_and_steady_state_rates():
    series = _series((4.0, 32, 320), (6.0, 32, 480), (8.0, 32, 160), start_s=0.0, end_s=10.0)
    r = rates(series)
    assert (r.samples_per_s, r.tokens_per_s) == (96 / 10, 960 / 10)
    # steady: steps 1..2 over the end of step 0 to the end of step 2
    assert (r.steady_samples_per_s, r.steady_tokens_per_s) == (64 / 4, 640 / 4)
    assert (r.num_samples, r.completion_tokens, r.mean_completion_tokens) == (96, 960, 10.0)
    assert rates(_series((2.0, 8, 8))).steady_samples_per_s is None
    assert r.mean_reward == 0.0 and r.late_reward == 0.0  # no reward recorded


def test_reward_over_the_timed_steps_and_over_the_last_quarter():
    # five steps of 8 samples; the last quarter is the last two steps (ceil(5 / 4))
    steps = [(float(k), 8, 80, reward) for k, reward in enumerate([8.0, 6.0, 4.0, 2.0, 0.0])]
    r = rates(_series(*steps))
    assert r.mean_reward == pytest.approx(20.0 / 40)
    assert r.late_reward == pytest.approx(2.0 / 16)
    assert rates(_series((1.0, 0, 0))).mean_reward is None  # nothing trained
    with pytest.raises(ValueError):
        rates(StepSeries(0.0, 1.0, ()))


def test_cpu_per_sample_is_the_windows_cpu_over_the_samples_trained():
    steps = (StepPoint(4.0, 32, 320), StepPoint(8.0, 32, 160))
    assert rates(StepSeries(0.0, 10.0, steps, cpu_s=1.6)).cpu_ms_per_sample == pytest.approx(25.0)
    assert rates(StepSeries(0.0, 10.0, steps)).cpu_ms_per_sample is None  # not measured
    back = StepSeries.from_json(StepSeries(0.0, 10.0, steps, cpu_s=1.6).to_json())
    assert (
        back.cpu_s == 1.6 and StepSeries.from_json({**back.to_json(), "cpu_s": None}).cpu_s is None
    )


def test_trl_series_starts_after_the_warm_up_step():
    points = [StepPoint(100.0, 8, 99), StepPoint(102.0, 8, 10, 4.0), StepPoint(103.0, 8, 20)]
    assert series_of(points) == _series((2.0, 8, 10, 4.0), (3.0, 8, 20))
    # the CPU of the timed steps only: from the warm-up step's end to the last step's
    assert series_of(points, [30.0, 34.0, 37.5]).cpu_s == pytest.approx(7.5)
    with pytest.raises(ValueError):
        series_of([StepPoint(1.0, 8, 8)])


def test_tandem_run_is_read_from_its_run_directory(tmp_path):
    steps = [{"step": 1, "end_s": 5.0}, {"step": 0, "end_s": 3.0}]
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    (tmp_path / "metrics.json").write_text(json.dumps({"makespan_s": 6.0}))
    pd.DataFrame({
        "train_step": [0, 0, 1, 1, None], "output_tokens": [10, 12, 7, 9, 50],
        "reward": [1.0, 0.5, 0.0, 0.25, 1.0],
    }).to_parquet(tmp_path / "samples.parquet")  # fmt: skip
    assert read_run(tmp_path) == _series((3.0, 2, 22, 1.5), (5.0, 2, 16, 0.25), end_s=6.0)
    (tmp_path / "metrics.json").write_text(json.dumps({"makespan_s": 6.0, "cpu_ms_per_sample": 9}))
    assert rates(read_run(tmp_path)).cpu_ms_per_sample == pytest.approx(9.0)  # 4 trained
    cmd = tandem_command(tmp_path / "spec.yaml", "pipeline", 20, tmp_path / "out")
    assert cmd[:3] == [sys.executable, "-m", "experiments.cli"] and "--live" in cmd
    assert "pipeline.mode=pipeline" in cmd and "run.iterations=20" in cmd
    assert not any(a.startswith("pipeline.max_lag") for a in cmd)  # pipeline's own lag


def test_a_spec_tuned_for_pipeline_runs_every_mode_at_its_fixed_lag(tmp_path):
    spec = override_spec(load_spec(CONFIG), ["pipeline.mode=pipeline", "pipeline.max_lag=4"])
    for mode, lag in (("disagg-sync", 0), ("stream-async", 1), ("pipeline", 4)):
        cmd = tandem_command(tmp_path / "spec.yaml", mode, 20, tmp_path / "out")
        sets = [a for a in cmd[cmd.index("--live") + 1 :] if "=" in a]
        run_spec = override_spec(spec, [s for s in sets if not s.startswith("run.")])
        assert (run_spec.pipeline.mode, run_spec.pipeline.max_lag) == (mode, lag)


# --- TRL wiring ---------------------------------------------------------------------


def _job(steps=3) -> TrlJob:
    spec = load_spec(CONFIG)
    return bp.trl_job(override_spec(spec, ["model.path=/m", "run.seed=5"]), steps, 2, "/o")


def test_trl_job_matches_the_spec():
    job = _job()
    assert (job.model_dir, job.seed, job.batch_size, job.group_size) == ("/m", 5, 32, 4)
    assert job.tasks == "mixed"
    longtail = override_spec(load_spec(CONFIG), ["model.path=/m", "workload.tasks=longtail"])
    assert bp.trl_job(longtail, 3, 2, "/o").tasks == "longtail"
    assert (job.max_output_tokens, job.temperature, job.learning_rate) == (128, 1.0, 1e-4)
    assert (job.num_prompts, job.clip_epsilon, job.threads) == (256, 0.2, 2)


def test_trl_steps_train_the_prompts_of_tandems_iterations(tmp_path):
    job = _job(steps=3)
    source = TaskPromptSource(TaskSet(5, 256, 128), 32, 4)
    ids = step_prompt_ids(job)
    assert ids == [source.prompt_ids(0)] + [source.prompt_ids(i) for i in range(3)]
    rows = dataset_rows(job)
    tasks = TaskSet(5, 256, 128)
    assert len(rows) == 4 * 8
    assert [r["prompt_id"] for r in rows] == [p for step in ids for p in step]
    assert all(r["prompt"] == tasks[r["prompt_id"]].text for r in rows)
    job.save(tmp_path / "job.json")
    assert TrlJob.load(tmp_path / "job.json") == job


def test_trl_reward_is_the_task_reward_and_counts_what_it_scores():
    tasks = TaskSet(0, 16, 128)
    reward = TaskReward(tasks)
    p, q = tasks[3], tasks[7]
    eos, unk = VOCAB.index("<eos>"), VOCAB.index("<unk>")
    right = [VOCAB.index(ch) for ch in p.answer] + [eos]
    with_unk = [VOCAB.index(ch) for ch in q.answer] + [unk, eos]  # TRL's text: q.answer
    out = reward(
        prompts=[p.text, q.text], completions=[p.answer, q.answer], prompt_id=[3, 7],
        completion_ids=[right, with_unk], trainer_state=None,
    )  # fmt: skip
    assert out == [1.0, tasks.reward(7, completion_text(with_unk))]  # as tandem's actor scores
    assert out[1] == len(q.answer) / (len(q.answer) + 1)  # the <unk> TRL's text hid is wrong
    assert reward.__name__ == "task_reward"
    assert reward.take() == (2, len(right) + len(with_unk), pytest.approx(sum(out)))
    assert reward.take() == (0, 0, 0.0)


# --- summary ------------------------------------------------------------------------


def _run(system, attempt, samples_per_s, disturbed=None) -> SystemRun:
    r = rates(_series((1.0, 8, 80, 6.0), (2.0, 8, 80, 2.0), end_s=16 / samples_per_s))
    return SystemRun(system, attempt, r, RunLoad(10.0, 5.0, 5.0, 2), disturbed)


def test_summary_takes_medians_over_accepted_rounds_and_ratios_to_trl(tmp_path):
    config = _config(tmp_path, modes=("pipeline",), rounds=3)
    results = []
    for attempt, (trl, pipe, why) in enumerate(
        [(100, 50, None), (10, 500, "busy"), (200, 150, None), (160, 80, None)]
    ):
        results.append(RoundResult(attempt, attempt, [_run(TRL, attempt, trl, why),
                                                      _run("pipeline", attempt, pipe)]))  # fmt: skip
    summary = summarize(config, results)
    assert summary["systems"][TRL]["samples_per_s"] == {
        "median": pytest.approx(160),
        "min": pytest.approx(100),
        "max": pytest.approx(200),
    }
    assert summary["ratio_to_trl"]["pipeline"]["samples_per_s"] == pytest.approx(80 / 160)
    assert [r["pipeline"] for r in summary["ratio_to_trl_per_round"]] == pytest.approx(
        [0.5, 0.75, 0.5]
    )
    assert summary["rounds_rejected"] == [{"round": 2, "reason": "trl: busy"}]
    assert len(csv_rows(results)) == 8
    rows = table_rows(config, summary)
    assert [row[0] for row in rows] == [TRL, "pipeline"]
    assert all(len(row) == len(TABLE_HEADER) for row in rows)
    assert rows[0][TABLE_HEADER.index("reward / last ¼")] == "0.50 / 0.25"


def test_bench_peers_without_trl_names_the_extra(monkeypatch, capsys):
    from experiments.cli import main

    monkeypatch.setitem(sys.modules, "trl", None)  # import trl raises ImportError
    assert main(["bench", "peers", "--steps", "2"]) == 2
    out = capsys.readouterr().out
    assert "tandem-rl[peers]" in out and "TRL" in out


def test_bench_peers_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="steps"):
        PeerBenchConfig(_config(tmp_path).spec, tmp_path, steps=1)
    with pytest.raises(ValueError, match="model.path"):
        PeerBenchConfig(load_spec(CONFIG), tmp_path)
