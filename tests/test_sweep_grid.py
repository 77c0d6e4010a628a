"""Grid axes: linked keys that vary together (generation against training GPUs at a fixed
total; before, axes formed only a product), and ``pipeline.max_lag=null`` in a grid of
modes × lags (before, a left-out sync point did not say how to keep it)."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml
from helpers import small_spec

from experiments import cli
from experiments.cli import main
from experiments.sweep import grid_points, parse_grid
from experiments.sweep_point import check_point_specs
from policies.spec import SpecError

GEN, TRAIN = "cluster.generation.0.num_gpus", "cluster.trainer.num_gpus"
LINKED = f"{GEN},{TRAIN}=2:6,4:4,6:2"
SMALL = ["--set", "algorithm.batch_size=64", "--set", "workload.max_output_tokens=2000",
         "--set", "run.iterations=1"]  # fmt: skip


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_linked_keys_vary_together_and_other_axes_multiply_them():
    points = grid_points([parse_grid(LINKED), parse_grid("run.seed=1,2")])
    assert points == [
        {GEN: g, TRAIN: t, "run.seed": s} for g, t in [(2, 6), (4, 4), (6, 2)] for s in (1, 2)
    ]
    # a ``:`` splits only linked values: a single key keeps ``profiled:PATH`` whole
    assert grid_points([parse_grid("sim.cost_model=roofline,profiled:x.csv")]) == [
        {"sim.cost_model": "roofline"},
        {"sim.cost_model": "profiled:x.csv"},
    ]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (f"{GEN},{TRAIN}=2:6,4", f"grid {GEN},{TRAIN}: '4' has 1 value(s) for 2 linked keys"),
        (f"{GEN},{TRAIN}=2:6:1", f"grid {GEN},{TRAIN}: '2:6:1' has 3 value(s) for 2 linked"),
        (f"{GEN},{TRAIN}=2:", f"grid {GEN},{TRAIN}: an empty value in '2:'"),
        (f"{GEN},bogus.key=2:6", "grid bogus.key: unknown spec key"),
        (f"{GEN},{TRAIN}=2:6,2:6", f"grid {GEN},{TRAIN}: the value 2:6 is given twice"),
        (f"{GEN},{GEN}=2:6", f"{GEN} given as more than one --grid axis"),
    ],
)
def test_a_linked_axis_of_the_wrong_shape_is_refused_naming_it(text, says):
    with pytest.raises(SpecError) as err:
        grid_points([parse_grid(text)])
    assert says in str(err.value)


def test_a_linked_sweep_gets_a_column_per_key_and_runs_each_split(tmp_path, monkeypatch):
    monkeypatch.setattr(cli.console, "width", 400)
    out = tmp_path / "sweep"
    fixed = ["--set", "policies.allocation=fixed", "--workers", "1", "--out", str(out)]
    assert main(["sweep", "streamrl-7b", *SMALL, "--grid", LINKED, *fixed]) == 0
    table = pd.read_csv(out / "results.csv")
    asked = [(2, 6), (4, 4), (6, 2)]
    assert list(zip(table[GEN], table[TRAIN])) == asked
    assert list(zip(table["generation_gpus"], table["trainer_gpus"])) == asked
    for i, split in enumerate(asked):
        ran = yaml.safe_load((out / "points" / f"{i:04d}" / "spec.yaml").read_text())["cluster"]
        assert (ran["generation"][0]["num_gpus"], ran["trainer"]["num_gpus"]) == split


def test_a_lag_a_sync_mode_refuses_says_a_grid_can_give_it_null():
    base = small_spec()
    points = [{"pipeline.mode": m, "pipeline.max_lag": lag}
              for m in ("stream-sync", "pipeline") for lag in (None, 2)]  # fmt: skip
    left_out = check_point_specs(base, points, skip_invalid=True)
    assert list(left_out) == [1]  # stream-sync at null runs, at its own lag
    assert "pipeline.max_lag=null point runs each mode at its own lag" in left_out[1]
    with pytest.raises(SpecError) as err:
        check_point_specs(base, points)
    assert "pipeline.max_lag=null point runs each mode at its own lag" in _flat(str(err.value))
