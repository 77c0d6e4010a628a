"""``tandem run`` and ``tandem sweep``: the files they write, their columns, their exit codes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers import (
    ALL_MODES,
    METRICS_KEYS,
    SAMPLE_COLUMNS,
    SMALL_YAML,
    SPAN_COLUMNS,
    STALENESS_BOUND,
    TANDEM,
)

from experiments import cli
from experiments.cli import main
from experiments.stop_signal import SigtermUnwinds
from policies.modes import MODES
from policies.spec import load_spec

SPAN_KINDS = {"prefill", "decode", "train", "weight_sync", "context_switch", "idle"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch):
    """Rich wraps at 80 columns when not on a terminal; keep messages on one line."""
    monkeypatch.setattr(cli.console, "width", 400)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_run_streamrl_7b_at_20k_writes_every_result_file(tmp_path, capsys, mode):
    out = tmp_path / "run"
    code = main(
        [
            "run",
            "streamrl-7b",
            "--set",
            "workload.max_output_tokens=20000",
            "--set",
            "run.iterations=2",
            "--set",
            f"pipeline.mode={mode}",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = _flat(capsys.readouterr().out)
    assert "throughput_samples_per_s" in printed
    for name in ("spec.yaml", "metrics.json", "samples.parquet", "events.parquet"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "timeline.png").read_bytes()[:8] == PNG_MAGIC

    spec = load_spec(out / "spec.yaml")  # the resolved spec loads back as it is
    assert spec.pipeline.mode == mode
    assert spec.workload.max_output_tokens == 20000
    assert spec.run.iterations == 2
    total = 2 * spec.algorithm.batch_size

    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics.keys() >= METRICS_KEYS
    assert metrics["num_samples_generated"] == metrics["num_samples_trained"] == total
    assert metrics["throughput_samples_per_s"] > 0
    assert metrics["throughput_tokens_per_s"] > metrics["throughput_samples_per_s"]
    assert 0 < metrics["generation_utilization"] <= 1
    assert 0 < metrics["trainer_utilization"] <= 1
    assert metrics["pipeline_bubble_s"] >= 0 and metrics["skewness_bubble_s"] >= 0
    bound = STALENESS_BOUND.get(mode, spec.pipeline.max_lag)
    assert 0 <= metrics["mean_staleness"] <= metrics["max_staleness"] <= bound
    assert 0 < metrics["sim_wall_s"] < 60

    samples = pd.read_parquet(out / "samples.parquet")
    assert list(samples.columns)[: len(SAMPLE_COLUMNS)] == SAMPLE_COLUMNS
    assert len(samples) == total
    assert samples["sample_id"].is_unique
    assert samples["reward"].isna().all()  # no rewards in the simulator
    assert (samples["train_step"] == samples["version_trained"]).all()
    assert (samples["output_tokens"] <= 20000).all()
    assert (samples["gen_start_s"] >= samples["dispatch_s"]).all()
    assert (samples["gen_end_s"] >= samples["gen_start_s"]).all()

    events = pd.read_parquet(out / "events.parquet")
    assert list(events.columns)[: len(SPAN_COLUMNS)] == SPAN_COLUMNS
    assert set(events["kind"]) <= SPAN_KINDS
    assert {"prefill", "decode", "train"} <= set(events["kind"])
    assert all(re.fullmatch(r"gen-\d+|trainer|link-\S+-\S+", r) for r in events["resource"])
    assert (events["end_s"] >= events["start_s"]).all()
    assert events["start_s"].min() >= 0
    if mode == "colocated-sync":
        assert "context_switch" in set(events["kind"])
    else:
        assert "weight_sync" in set(events["kind"])
    trainer = events[events["resource"] == "trainer"]
    assert set(trainer["kind"]) <= {"train", "context_switch"}


def test_run_default_spec_name_and_summary(tmp_path, capsys):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SMALL_YAML)
    out = tmp_path / "run"
    assert main(["run", str(spec), "--out", str(out)]) == 0
    assert "results in" in _flat(capsys.readouterr().out)
    assert load_spec(out / "spec.yaml") == load_spec(spec)


def test_sweep_records_a_point_that_fails_as_it_runs_and_keeps_the_others(tmp_path):
    # the command refuses such a point before anything runs (below); run_sweep itself
    # records what fails inside a point (a profile gone since, a bug) as that point's row
    from experiments.sweep import parse_grid, run_sweep

    spec = tmp_path / "tiny.yaml"
    spec.write_text(SMALL_YAML)
    out = tmp_path / "sweep"
    axes = [
        parse_grid("pipeline.mode=disagg-sync,stream-async"),
        parse_grid(f"sim.cost_model=roofline,profiled:{tmp_path / 'no-such-profile.csv'}"),
    ]
    frame = run_sweep(load_spec(spec), axes, out, workers=2, quiet=True).frame
    assert len(frame) == 4
    assert list(frame["point"]) == [0, 1, 2, 3]
    ok = frame[frame["error"].isna()]
    assert list(ok["pipeline.mode"]) == ["disagg-sync", "stream-async"]
    assert (ok["num_samples_trained"] == 16).all()
    assert (ok["throughput_samples_per_s"] > 0).all()
    failed = frame[frame["error"].notna()]
    assert len(failed) == 2 and failed["error"].str.contains("no-such-profile.csv").all()
    assert pd.read_parquet(out / "results.parquet").shape[0] == 4
    for i in ok["point"]:
        assert (out / "points" / f"{i:04d}" / "metrics.json").exists()


@pytest.mark.parametrize(
    ("grid", "point", "message"),
    [
        ("model.name=Qwen2.5-7B,NoSuchModel-1B", "model.name=NoSuchModel-1B",
         "model.name: unknown model 'NoSuchModel-1B'"),
        ("cluster.generation.0.hardware=H800,B200", "cluster.generation.0.hardware=B200",
         "cluster.generation.0.hardware: unknown hardware 'B200'"),
        ("policies.allocation=fixed,balanced", "policies.allocation=balanced",
         "policies.allocation 'balanced' supports one generation pool"),
    ],
)  # fmt: skip
def test_sweep_refuses_a_point_the_simulator_would_refuse_before_out(
    tmp_path, capsys, grid, point, message
):
    """Before: --out was made, the good points ran, the bad one failed, exit 1."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SMALL_YAML)
    out = tmp_path / "sweep"
    two_pools = "cluster.generation=[{num_gpus: 1}, {num_gpus: 1, hardware: H20}]"
    args = ["sweep", str(spec), "--grid", grid, "--set", two_pools, "--out", str(out)]
    assert main(args) == 2
    printed = _flat(capsys.readouterr().out)
    assert f"grid point {point}: {message}" in printed
    assert not out.exists()


def test_skip_invalid_leaves_out_the_points_no_mode_takes_and_lists_them(tmp_path, capsys):
    """Seen: ``--grid pipeline.mode=stream-async,pipeline --grid pipeline.max_lag=1,4`` was
    refused outright (stream-async's lag is fixed at 1), so one sweep could not compare
    stream-async with pipeline's lags."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SMALL_YAML)
    out = tmp_path / "sweep"
    grid = ["--grid", "pipeline.mode=stream-async,pipeline", "--grid", "pipeline.max_lag=1,4"]
    assert main(["sweep", str(spec), *grid, "--out", str(out)]) == 2
    assert "--skip-invalid" in _flat(capsys.readouterr().out) and not out.exists()
    assert main(["sweep", str(spec), *grid, "--skip-invalid", "--out", str(out)]) == 0
    assert "1 of 4 points left out" in _flat(capsys.readouterr().out)
    results = pd.read_csv(out / "results.csv")
    assert results["point"].tolist() == [0, 2, 3] and results["error"].isna().all()
    left = pd.read_csv(out / "left_out.csv")
    assert left[["point", "pipeline.mode", "pipeline.max_lag"]].values.tolist() == [
        [1, "stream-async", 4]
    ]
    assert "does not apply to mode 'stream-async'" in left["why"][0]
    # a grid of nothing but refused points is still refused
    only = ["--grid", "pipeline.mode=stream-async", "--grid", "pipeline.max_lag=3,4"]
    assert main(["sweep", str(spec), *only, "--skip-invalid", "--out", str(tmp_path / "b")]) == 2


def test_bench_sim_prints_json_with_every_mode_and_the_fast_forward_speedup(capsys):
    args = ["bench", "sim", "streamrl-7b", "--iterations", "1"]
    assert main([*args, "--set", "algorithm.batch_size=64", "--set", "run.iterations=1"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(report["modes"]) == set(MODES.names())
    assert all(m["wall_s"] > 0 for m in report["modes"].values())
    assert report["fast_forward_speedup"] > 1


def test_sigterm_unwinds_like_ctrl_c_and_exits_143(tmp_path):
    """A scheduler's SIGTERM stops a run as Ctrl-C does: the run's files say why, the
    exit code is the shell's 128 + 15, and the handler before the command is back after."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SMALL_YAML)
    out = tmp_path / "run"
    cmd = [*TANDEM, "run", str(spec),
           "--set", "run.iterations=100000", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(cmd, env=ENV, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (out / "spec.yaml").exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # a run saves its resolved spec as it starts
        time.sleep(0.5)  # and simulates on
        proc.send_signal(signal.SIGTERM)
        printed, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143
    assert "terminated" in printed and "resume with" not in printed  # a sim run starts again
    assert "the run stopped: KeyboardInterrupt: stopped by SIGTERM" in (out / "run.log").read_text()
    assert load_spec(out / "spec.yaml", []).run.iterations == 100000
    assert not (out / "metrics.json").exists()  # it stopped mid-run
    before = signal.getsignal(signal.SIGTERM)
    with SigtermUnwinds() as stop, pytest.raises(KeyboardInterrupt, match="stopped by SIGTERM"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler runs at the next bytecode
    assert stop.exit_code() == 143 and signal.getsignal(signal.SIGTERM) == before
    with SigtermUnwinds() as stop:
        pass
    assert stop.exit_code() == 130  # Ctrl-C's, where no SIGTERM came
