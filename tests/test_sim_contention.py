"""Contention on one host: a profiled ``decode_slowdown`` applies while the trainer computes,
a ``train_slowdown`` to train jobs that start while an instance decodes."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import write_cost_model

from policies.spec import load_spec
from sim.simulator import Simulation

CONFIG = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "live-tiny.yaml"


def _cost_model(path: Path, contended: float | None, train: float | None = None) -> Path:
    ops = {"weight_transfer": (["1"], [0.05]), "weight_pause": (["1"], [0.04])}
    if contended is not None:
        ops["decode_slowdown"] = (["1"], [contended])
    if train is not None:
        ops["train_slowdown"] = (["1"], [train])
    return write_cost_model(path, **ops)


def _run(cost_dir: Path, mode: str) -> dict:
    overrides = [f"pipeline.mode={mode}", f"sim.cost_model=profiled:{cost_dir}",
                 "run.iterations=4", "workload.lognormal_median_tokens=40",
                 # group siblings of different lengths: training overlaps decode often
                 "workload.prompt_correlation=0.7"]  # fmt: skip
    metrics = Simulation(load_spec(CONFIG, overrides)).run().metrics
    del metrics["sim_wall_s"]  # the host's time, not the simulation's
    return metrics


@pytest.mark.parametrize("mode", ["stream-sync", "stream-async", "pipeline"])
def test_overlapping_modes_decode_slower_while_the_trainer_computes(tmp_path, mode):
    free = _run(_cost_model(tmp_path / "free", None), mode)
    contended = _run(_cost_model(tmp_path / "x2", 2.0), mode)
    assert contended["generation_time_s"] > 1.05 * free["generation_time_s"]
    assert contended["makespan_s"] > free["makespan_s"]


def test_a_mode_that_never_overlaps_is_unchanged(tmp_path):
    free = _run(_cost_model(tmp_path / "free", None), "disagg-sync")
    contended = _run(_cost_model(tmp_path / "x2", 2.0), "disagg-sync")
    assert contended["makespan_s"] == free["makespan_s"]


@pytest.mark.parametrize("mode", ["stream-sync", "pipeline"])
def test_switching_to_an_identical_law_changes_nothing(tmp_path, mode):
    """Every trainer start/stop splits the engine's decode run at a step boundary: exact."""
    free = _run(_cost_model(tmp_path / "free", None), mode)
    same = _run(_cost_model(tmp_path / "x1", 1.0), mode)
    assert same == free


def _train_busy_s(metrics: dict) -> float:
    return metrics["trainer_utilization"] * metrics["makespan_s"]


def test_training_that_overlaps_decode_is_slower_and_other_training_is_not(tmp_path):
    free = _run(_cost_model(tmp_path / "free", None), "stream-sync")
    slow = _run(_cost_model(tmp_path / "t2", None, train=2.0), "stream-sync")
    assert _train_busy_s(slow) > 1.3 * _train_busy_s(free)
    free = _run(_cost_model(tmp_path / "free", None), "disagg-sync")
    slow = _run(_cost_model(tmp_path / "t2", None, train=2.0), "disagg-sync")
    assert slow == free  # disagg-sync trains only after generation has ended


def test_an_identical_training_rate_changes_nothing(tmp_path):
    free = _run(_cost_model(tmp_path / "free", None), "pipeline")
    assert _run(_cost_model(tmp_path / "t1", 1.0, train=1.0), "pipeline") == free
