"""``tandem advise`` against the exhaustive grid fixtures of the StreamRL specs at 20K.

The fixtures (``tests/fixtures/advise_grid``, from ``python -m experiments.advise_grid``)
hold every candidate's simulated figures; a fingerprint check re-simulates a few of them
first, so a changed simulator fails here with the command that regenerates them. Then the
search runs on the fixture's figures (the same numbers the simulator gives, without the
wait) with an unlimited budget: it must find the grid's best, with far fewer simulations
than the grid. How long it takes on this machine is the benchmark's business
(``python -m experiments.advise_bench``), not a test's.
"""

from __future__ import annotations

import json
import shutil

import pytest

from experiments.advise import AdviseOptions, advise
from experiments.advise_grid import (
    BENCH_AXES,
    BENCH_SPECS,
    FIXTURES,
    FixtureStale,
    ReplayEvaluator,
    bench_spec,
    check_fixture,
    load_fixture,
)
from experiments.advise_plan import SpaceOptions

UNLIMITED_S = 1e9


@pytest.mark.parametrize("name", BENCH_SPECS)
def test_advise_finds_the_grid_best_with_a_fraction_of_its_simulations(name):
    fixture = load_fixture(name)
    check_fixture(fixture)  # raises FixtureStale naming the regenerate command
    replay = ReplayEvaluator(fixture)
    options = AdviseOptions(SpaceOptions(axes=BENCH_AXES), budget_s=UNLIMITED_S, workers=1)
    advice = advise(bench_spec(name), options, evaluator=replay)
    assert advice.best_value >= fixture.best_value
    assert advice.result.finished and advice.result.coverage == 1.0
    grid_sims = (
        fixture.frame["full_iterations"].notna().sum()
        + fixture.frame["short_iterations"].notna().sum()
    )
    searched = len(advice.result.evaluations)
    print(
        f"{name}: advise {searched} simulations in the search (+{len(replay.calls) - searched} pricing changes), grid {grid_sims}"
    )
    assert searched <= grid_sims / 10


def test_a_changed_simulator_makes_the_fixture_stale(tmp_path):
    name = "streamrl-72b"
    shutil.copy(FIXTURES / f"{name}.csv", tmp_path / f"{name}.csv")
    meta = json.loads((FIXTURES / f"{name}.json").read_text())
    meta["probes"][0]["throughput_samples_per_s"] *= 1.01
    (tmp_path / f"{name}.json").write_text(json.dumps(meta))
    with pytest.raises(
        FixtureStale,
        match="regenerate the fixture with: nice -n 19 python -m experiments.advise_grid streamrl-72b",
    ):
        check_fixture(load_fixture(name, tmp_path))


def test_a_changed_space_makes_the_fixture_stale(tmp_path):
    name = "streamrl-72b"
    shutil.copy(FIXTURES / f"{name}.csv", tmp_path / f"{name}.csv")
    meta = json.loads((FIXTURES / f"{name}.json").read_text())
    meta["space_digest"] = "0" * 16
    (tmp_path / f"{name}.json").write_text(json.dumps(meta))
    with pytest.raises(FixtureStale, match="space of streamrl-72b changed"):
        check_fixture(load_fixture(name, tmp_path))


def test_a_missing_fixture_names_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m experiments.advise_grid streamrl-7b"):
        load_fixture("streamrl-7b", tmp_path)


def test_a_grid_generated_in_two_processes_equals_one_generated_in_one(tmp_path, monkeypatch):
    """``--workers``: the same rows in the space's order (only the measured wall times
    differ), and the meta's probes and best alike."""
    import pandas as pd

    import experiments.advise_grid as grid
    from experiments.advise_plan import plan_space

    spec = bench_spec("streamrl-7b").model_copy(deep=True)
    spec.run.iterations = 2
    axes = ("mode=stream-async", "tp=1", "max_num_seqs=256", "dispatch=least-loaded",
            "scheduling=fcfs", "predictor=oracle", "split_parts=4")  # fmt: skip
    space = plan_space(spec, SpaceOptions(axes=axes))
    assert 2 <= len(space.candidates) <= 8
    monkeypatch.setattr(grid, "bench_space", lambda name: space)
    one = pd.read_csv(grid.generate("streamrl-7b", tmp_path / "one", log=False))
    two = pd.read_csv(grid.generate("streamrl-7b", tmp_path / "two", log=False, workers=2))
    walls = [c for c in one.columns if c.endswith("wall_s")]
    pd.testing.assert_frame_equal(one.drop(columns=walls), two.drop(columns=walls))
    metas = [json.loads((tmp_path / d / "streamrl-7b.json").read_text()) for d in ("one", "two")]
    for key in ("best", "probes", "num_candidates", "space_digest"):
        assert metas[0][key] == metas[1][key]
