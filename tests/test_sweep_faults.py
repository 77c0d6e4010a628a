"""Sweeps that survive a bad point (issue #16, item 8): a per-point timeout, one result file
per point written as it finishes, a resume that skips the points already done, and a
non-zero exit whenever a point failed."""

from __future__ import annotations

import json
import os
import signal

import pandas as pd
import pytest

from experiments import cli
from experiments.cli import main

SMALL = ["--set", "algorithm.batch_size=64", "--set", "workload.max_output_tokens=2000"]
# point 0: two iterations (seconds); point 1: 100,000 iterations (far over the timeout)
GRID = ["--grid", "run.iterations=2,100000", "--point-timeout", "4", "--workers", "2"]


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch):
    monkeypatch.setattr(cli.console, "width", 400)


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_a_point_over_its_time_is_stopped_the_others_kept_and_the_exit_is_non_zero(
    tmp_path, capsys
):
    out = tmp_path / "sweep"
    assert main(["sweep", "streamrl-7b", *GRID, *SMALL, "--out", str(out)]) == 1
    printed = _flat(capsys.readouterr().out)
    assert "2 points, 1 failed" in printed and "point took over 4 s (stopped)" in printed
    rows = [json.loads((out / "points" / f"{i:04d}" / "row.json").read_text()) for i in (0, 1)]
    assert rows[0]["error"] is None and rows[0]["num_samples_trained"] == 128
    assert rows[1]["error"].startswith("TimeoutError")
    frame = pd.read_csv(out / "results.csv")
    assert list(frame["point"]) == [0, 1] and frame["error"].notna().tolist() == [False, True]


def test_a_point_stopped_while_saving_leaves_no_result_files_that_look_finished(tmp_path):
    """Before: a point killed over its time after writing metrics.json and samples.parquet
    (a long trace.json still to write) kept them beside a row saying it failed."""
    out = tmp_path / "sweep"
    stopped = out / "points" / "0001"
    stopped.mkdir(parents=True)
    for name in ("metrics.json", "samples.parquet"):  # what the killed worker had written
        (stopped / name).write_text("{}")
    assert main(["sweep", "streamrl-7b", *GRID, *SMALL, "--out", str(out)]) == 1
    assert json.loads((stopped / "row.json").read_text())["error"].startswith("TimeoutError")
    assert not (stopped / "metrics.json").exists() and not (stopped / "samples.parquet").exists()
    assert (out / "points" / "0000" / "metrics.json").exists()  # the finished point keeps its


def test_a_second_sweep_into_the_same_out_skips_the_points_done(tmp_path, capsys):
    out = tmp_path / "sweep"
    main(["sweep", "streamrl-7b", *GRID, *SMALL, "--out", str(out)])
    done = out / "points" / "0000" / "row.json"
    stamp = (done.stat().st_mtime_ns, done.read_text())
    failed = out / "points" / "0001" / "row.json"
    failed_stamp = failed.stat().st_mtime_ns
    capsys.readouterr()
    assert main(["sweep", "streamrl-7b", *GRID, *SMALL, "--out", str(out)]) == 1
    assert (done.stat().st_mtime_ns, done.read_text()) == stamp  # not simulated again
    assert failed.stat().st_mtime_ns != failed_stamp  # the failed point ran again
    assert "2 points (1 already done), 1 failed" in _flat(capsys.readouterr().out)


def test_a_sweep_run_again_when_every_point_is_done_says_so(tmp_path, capsys):
    """Before: '2 points, 0 failed' beside a progress bar with no ETA, as if run again."""
    out = tmp_path / "sweep"
    grid = ["--grid", "run.seed=1,2", "--set", "run.iterations=1", *SMALL, "--out", str(out)]
    assert main(["sweep", "streamrl-7b", *grid]) == 0
    assert "2 points, 0 failed" in _flat(capsys.readouterr().out)
    assert main(["sweep", "streamrl-7b", *grid]) == 0
    assert "2 points (2 already done), 0 failed" in _flat(capsys.readouterr().out)


def test_another_grid_into_the_same_out_is_refused(tmp_path, capsys):
    out = tmp_path / "sweep"
    grid = ["--grid", "run.seed=1,2", "--set", "run.iterations=1", *SMALL]
    assert main(["sweep", "streamrl-7b", *grid, "--out", str(out)]) == 0
    other = ["--grid", "run.seed=3,4", "--set", "run.iterations=1", *SMALL]
    assert main(["sweep", "streamrl-7b", *other, "--out", str(out)]) == 2
    assert "another spec or grid" in _flat(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("grid", "says"),
    [
        (["--grid", "run.seed=1,2,1"], "grid run.seed: the value 1 is given twice"),
        (["--grid", "run.seed=1,2", "--grid", "run.seed=3"], "run.seed given as more than one"),
        # before: every point failed (the --out made), and an empty value was dropped
        (["--grid", "bogus.key=1,2"], "grid bogus.key: unknown spec key"),
        (["--grid", "cluster.generation.0.tpp=1,2"], "cluster.generation.0.tpp: unknown spec"),
        (["--grid", "run.seed=1,,2"], "grid run.seed: an empty value in '1,,2'"),
    ],
)
def test_a_grid_that_repeats_a_key_or_value_is_refused_before_anything_is_written(
    tmp_path, capsys, grid, says
):
    out = tmp_path / "sweep"
    assert main(["sweep", "streamrl-7b", *grid, *SMALL, "--out", str(out)]) == 2
    assert says in _flat(capsys.readouterr().out)
    assert not out.exists()


@pytest.mark.parametrize(
    "given", [["--set", "run.tracking=tensorboard"], ["--grid", "run.tracking=none,tensorboard"]]
)
def test_a_sweep_given_tracking_is_refused_rather_than_silently_untracked(tmp_path, capsys, given):
    """Before: the points ran and nothing was tracked, locally and on Ray."""
    out = tmp_path / "sweep"
    code = main(["sweep", "streamrl-7b", "--grid", "run.seed=1,2", *given, *SMALL,
                 "--out", str(out)])  # fmt: skip
    assert code == 2
    assert "run.tracking: a sweep does not track its points" in _flat(capsys.readouterr().out)
    assert not out.exists()


def _ctrl_c(*args, **kwargs):
    raise KeyboardInterrupt


def _sweep_stopped_after_its_last_point(tmp_path, capsys) -> tuple[int, str]:
    out = tmp_path / "sweep"
    grid = ["--grid", "run.seed=1,2", "--set", "run.iterations=1", *SMALL, "--workers", "1"]
    code = main(["sweep", "streamrl-7b", *grid, "--out", str(out)])
    return code, _flat(capsys.readouterr().out)


def test_ctrl_c_while_the_summary_is_drawn_after_the_last_point_says_the_sweep_is_complete(
    tmp_path, capsys, monkeypatch
):
    """Before: the results printed, then 'interrupted' and exit 130, as if points were lost."""
    from experiments import plots

    monkeypatch.setattr(plots, "sweep_summary", _ctrl_c)
    code, printed = _sweep_stopped_after_its_last_point(tmp_path, capsys)
    assert code == 0
    assert "interrupted after every point had run (2 points, 0 failed)" in printed
    assert "the sweep is complete" in printed and "summary.png may be missing" in printed
    assert len(pd.read_csv(tmp_path / "sweep" / "results.csv")) == 2


def test_ctrl_c_after_the_last_point_before_the_tables_still_writes_them(
    tmp_path, capsys, monkeypatch
):
    """Before: exit 130, 'interrupted', and no results.csv although every point had run."""
    from experiments import sweep

    run_jobs = sweep.run_jobs

    def then_ctrl_c(*args, **kwargs) -> None:
        run_jobs(*args, **kwargs)  # every point runs and has its row
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "run_jobs", then_ctrl_c)
    code, printed = _sweep_stopped_after_its_last_point(tmp_path, capsys)
    assert code == 0
    assert "2 points, 0 failed" in printed
    assert "interrupted after every point had run (2 points, 0 failed)" in printed
    frame = pd.read_csv(tmp_path / "sweep" / "results.csv")
    assert list(frame["point"]) == [0, 1] and frame["error"].isna().all()


@pytest.mark.parametrize(("sig", "code", "said"), [
    (signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated"),
])  # fmt: skip
def test_a_stopped_sweep_writes_partial_results_that_its_resume_completes(
    tmp_path, capsys, monkeypatch, sig, code, said
):
    """Before: the finished points had their row.json, but no results.csv until a resume."""
    from experiments import sweep

    run_jobs = sweep.run_jobs

    def signal_after_the_first_row(pool, jobs, on_row) -> None:
        def then_signal(index: int, row: dict) -> None:
            on_row(index, row)
            os.kill(os.getpid(), sig)

        run_jobs(pool, jobs, then_signal)

    monkeypatch.setattr(sweep, "run_jobs", signal_after_the_first_row)
    out = tmp_path / "sweep"
    grid = ["--grid", "run.seed=1,2,3", "--set", "run.iterations=1", *SMALL, "--workers", "1"]
    assert main(["sweep", "streamrl-7b", *grid, "--out", str(out)]) == code
    assert _flat(capsys.readouterr().out).endswith(
        f"{said}; partial results (1 of 3 points) in {out / 'results.csv'} (status.json: "
        "partial); the same command again resumes the sweep"
    )
    assert list(pd.read_csv(out / "results.csv")["point"]) == [0]
    assert list(pd.read_parquet(out / "results.parquet")["point"]) == [0]
    status = {"status": "partial", "num_points_run": 1, "num_points": 3}
    assert json.loads((out / "status.json").read_text()) == status
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temp file left

    monkeypatch.setattr(sweep, "run_jobs", run_jobs)  # as it was: the resume
    assert main(["sweep", "streamrl-7b", *grid, "--out", str(out)]) == 0
    assert "3 points (1 already done), 0 failed" in _flat(capsys.readouterr().out)
    assert list(pd.read_csv(out / "results.csv")["point"]) == [0, 1, 2]
    status = {"status": "complete", "num_points_run": 3, "num_points": 3}
    assert json.loads((out / "status.json").read_text()) == status
