"""``length_predictor: ranker`` from every entry point: one builder (``ranker_for``) hands
the live paths an online ranker and the sim paths a fitted one; no vLLM needed here (the
live runner is replaced by a simulated run of the same spec)."""

from __future__ import annotations

import pytest
from helpers import write_cost_model

import runtime.launcher
from experiments.bench_live import MODES, bench_modes
from experiments.cli import main
from experiments.fidelity import case_spec, run_case
from experiments.predictors import ranker_for
from experiments.specs import config_path
from policies.spec import load_spec
from ranker.online import RankerPredictor
from sim.simulator import Simulation

SMALL = [
    "run.iterations=3", "algorithm.batch_size=8", "algorithm.group_size=2",
    "workload.num_prompts=8", "workload.max_output_tokens=40",
    "workload.lognormal_median_tokens=12", "policies.length_predictor=ranker",
]  # fmt: skip


@pytest.fixture()
def cost(tmp_path):
    """A calibrated cost model: the sim of live-tiny's tiny model needs one."""
    return write_cost_model(tmp_path / "cm")


def _spec(*overrides: str):
    return load_spec(config_path("live-tiny"), [*SMALL, *overrides])


class FakeLive:
    """Stands in for ``runtime.launcher.run_live`` (with its signature): records the
    predictor it was handed and returns a simulated run of the spec (with the sim's
    fitted ranker)."""

    def __init__(self) -> None:
        self.predictors: list = []

    def __call__(
        self, spec, out_dir, length_predictor=None, force_new_spec=False, after_step=None,
        on_step=None, ray_address=None,
    ):  # fmt: skip
        self.predictors.append(length_predictor)
        result = Simulation(spec, ranker=ranker_for(spec)).run(on_step=on_step)
        result.save(out_dir)
        return result


def test_ranker_for_builds_an_online_ranker_live_and_a_fitted_one_in_the_sim():
    assert ranker_for(_spec("policies.length_predictor=oracle"), live=True) is None
    live = ranker_for(_spec(), live=True)
    assert isinstance(live, RankerPredictor) and live.fitted is None  # learns as it goes
    assert ranker_for(_spec()).fitted is not None


def test_tandem_run_live_hands_the_launcher_an_online_ranker(monkeypatch, tmp_path, cost):
    fake = FakeLive()
    monkeypatch.setattr(runtime.launcher, "run_live", fake)
    args = [f"--set={o}" for o in [*SMALL, f"sim.cost_model=profiled:{cost}"]]
    assert main(["run", "live-tiny", "--live", "--out", str(tmp_path), *args]) == 0
    ((predictor,),) = [fake.predictors]
    assert isinstance(predictor, RankerPredictor) and predictor.fitted is None


def test_a_fidelity_case_accepts_the_ranker_live_and_in_its_twin(monkeypatch, tmp_path, cost):
    fake = FakeLive()
    monkeypatch.setattr(runtime.launcher, "run_live", fake)
    spec = case_spec(
        _spec(f"sim.cost_model=profiled:{cost}"), "stream-async", None, "http://x", "t", 0, cost
    )
    live, twin = run_case(spec, tmp_path / "case", cost)
    assert isinstance(fake.predictors[0], RankerPredictor)
    assert twin.spec.policies.length_predictor == "ranker"
    assert twin.samples_frame()["predicted_output_tokens"].notna().any()  # the twin's ranker


def test_bench_live_hands_every_mode_an_online_ranker(monkeypatch, tmp_path, cost):
    fake = FakeLive()
    monkeypatch.setattr(runtime.launcher, "run_live", fake)
    base = _spec(f"sim.cost_model=profiled:{cost}")
    figures = bench_modes(base, "http://x", "t", tmp_path / "bench", rounds=1)
    assert set(figures["samples_per_s"]) == set(MODES)
    assert len(fake.predictors) == len(MODES)
    assert all(isinstance(p, RankerPredictor) for p in fake.predictors)
    assert len({id(p) for p in fake.predictors}) == len(MODES)  # one fresh ranker per run


def test_python_m_runtime_launcher_points_to_the_cli():
    with pytest.raises(SystemExit, match="tandem run SPEC --live"):
        runtime.launcher.main()
