"""A ranker file from every command that runs a spec (``experiments.runs``): ``sweep``,
``fidelity``, ``bench`` and ``advise`` refuse a bad ``policies.ranker_path`` before they run
anything, as ``tandem run`` does; their runs rank with the file and record the ranker's
source and quality in metrics.json. No vLLM needed: the live runner is replaced by a
simulated run with ``runtime.launcher.run_live``'s own signature."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import write_cost_model

import experiments.bench_live
import runtime.launcher
from experiments.advise import Advice
from experiments.advise_eval import Evaluation
from experiments.advise_live import LivePlan, check_live_spec, live_check
from experiments.advise_plan import SpaceOptions, plan_space
from experiments.advise_search import SearchResult
from experiments.bench import bench_sim
from experiments.bench_live import MODES, bench_live, bench_modes
from experiments.cli import main
from experiments.fidelity import case_spec, run_case
from experiments.fidelity_plan import FidelityPlan, check_fidelity
from experiments.predictors import task_trace
from experiments.ranker_quality import RANKER_METRICS
from experiments.specs import config_path
from experiments.sweep_point import point_dir, run_point
from policies.spec import load_spec
from sim.simulator import Simulation
from tests.test_ranker_sources import SMALL, _spec, fit_model_file

LIVE_SMALL = [
    "run.iterations=3", "algorithm.batch_size=8", "algorithm.group_size=2",
    "workload.num_prompts=8", "workload.max_output_tokens=40",
    "workload.lognormal_median_tokens=12", "policies.length_predictor=ranker",
]  # fmt: skip


@pytest.fixture()
def cost(tmp_path) -> Path:
    """A calibrated cost model: the sim of live-tiny's tiny model needs one."""
    return write_cost_model(tmp_path / "cm")


@pytest.fixture()
def model_file(tmp_path) -> Path:
    """A ranker fitted with ``--no-text`` (sim and live)."""
    return fit_model_file(tmp_path)


@pytest.fixture()
def text_model(tmp_path) -> Path:
    """A ranker fitted on prompt text (without ``--no-text``): live only."""
    trace = tmp_path / "tasks.parquet"
    task_trace(0, 64, 128).to_parquet(trace)
    model = tmp_path / "text.ranker"
    assert main(["ranker", "fit", str(trace), "--out", str(model)]) == 0
    return model


def _live_spec(*overrides: str):
    return load_spec(config_path("live-tiny"), [*LIVE_SMALL, *overrides])


class FakeLive:
    """Stands in for ``runtime.launcher.run_live`` (same signature): records what it was
    handed and saves a simulated run of the spec ranked by the predictor it got."""

    def __init__(self) -> None:
        self.predictors: list = []
        self.calls: list[tuple] = []  # (force_new_spec, on_step)

    def __call__(
        self, spec, out_dir, length_predictor=None, force_new_spec=False, after_step=None,
        on_step=None, ray_address=None,
    ):  # fmt: skip
        self.predictors.append(length_predictor)
        self.calls.append((force_new_spec, on_step))
        result = Simulation(spec, ranker=length_predictor).run(on_step=on_step)
        result.save(out_dir)
        return result


def _said(capsys) -> str:
    return " ".join(capsys.readouterr().out.split())


def _file_source(path: Path) -> str:
    return f"file {path} "


# -- tandem sweep ---------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["missing", "text"])
def test_a_sweep_refuses_a_bad_ranker_file_before_any_point(tmp_path, text_model, which, capsys):
    bad = text_model if which == "text" else tmp_path / "gone.ranker"
    out = tmp_path / "sweep"
    sets = [f"--set={o}" for o in [*SMALL, f"policies.ranker_path={bad}"]]
    grid = ["--grid", "pipeline.mode=stream-sync,one-step-async"]
    assert main(["sweep", "streamrl-7b", *sets, *grid, "--out", str(out)]) == 2
    assert not out.exists()  # refused before any point ran
    said = _said(capsys)
    assert "policies.ranker_path:" in said and bad.name in said
    assert ("--no-text" if which == "text" else "does not exist") in said


def test_each_sweep_point_records_its_rankers_source_and_quality(tmp_path, model_file):
    base = _spec(f"policies.ranker_path={model_file}")
    for index, mode in enumerate(["stream-sync", "one-step-async"]):
        out = point_dir(tmp_path / "sweep", index)
        row = run_point(base, {"pipeline.mode": mode}, out)
        assert row["error"] is None
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["ranker_source"].startswith(_file_source(model_file))
        assert 0.5 < metrics["ranker_spearman"] <= 1 and metrics["ranker_num_iterations"] == 6
        assert {k: row[k] for k in RANKER_METRICS} == {k: metrics[k] for k in RANKER_METRICS}
        assert "ranker quality on the run's own samples" in (out / "run.log").read_text()
    # as a `tandem run` of the same point says
    run_out = tmp_path / "run"
    sets = [f"--set={o}" for o in [*SMALL, f"policies.ranker_path={model_file}"]]
    assert main(["run", "streamrl-7b", "--out", str(run_out), *sets, "--set=pipeline.mode=one-step-async"]) == 0  # fmt: skip
    ran = json.loads((run_out / "metrics.json").read_text())
    assert {k: ran[k] for k in RANKER_METRICS} == {k: metrics[k] for k in RANKER_METRICS}


# -- tandem fidelity ------------------------------------------------------------------------


def test_fidelity_refuses_a_ranker_file_its_sim_twins_cannot_use(tmp_path, text_model):
    """A text ranker serves a live run, but every live case's sim twin ranks with it too."""
    plan = FidelityPlan(modes=("pipeline",))
    with pytest.raises(ValueError, match=r"policies.ranker_path: .*text.ranker.*--no-text"):
        check_fidelity(_live_spec(f"policies.ranker_path={text_model}"), plan, tmp_path / "f")
    gone = tmp_path / "gone.ranker"
    with pytest.raises(ValueError, match=r"policies.ranker_path: .*gone.ranker does not exist"):
        check_fidelity(_live_spec(f"policies.ranker_path={gone}"), plan, tmp_path / "f")


def test_a_fidelity_case_records_the_files_ranker_live_and_in_its_twin(
    monkeypatch, tmp_path, model_file, cost
):
    fake = FakeLive()
    monkeypatch.setattr(runtime.launcher, "run_live", fake)
    base = _live_spec(f"policies.ranker_path={model_file}", f"sim.cost_model=profiled:{cost}")
    spec = case_spec(base, "stream-async", None, "http://x", "t", 0, cost)
    steps: list = []
    run_case(spec, tmp_path / "case", cost, steps.append)
    ((predictor,),) = [fake.predictors]
    assert predictor.source.startswith(_file_source(model_file))
    # seen: on_step went into run_live's force_new_spec, and the progress bar never moved
    assert fake.calls == [(False, steps.append)] and len(steps) == 3
    for side in ("live", "sim"):
        metrics = json.loads((tmp_path / "case" / side / "metrics.json").read_text())
        assert metrics["ranker_source"].startswith(_file_source(model_file))
        assert metrics["ranker_num_iterations"] == 3


# -- tandem bench ---------------------------------------------------------------------------


def test_bench_sim_says_how_each_modes_ranker_ranked(model_file):
    report = bench_sim(_spec(f"policies.ranker_path={model_file}"), iterations=2)
    for figures in report["modes"].values():
        assert figures["ranker_source"].startswith(_file_source(model_file))
        # two iterations of the first epoch: no prompt has a history yet (chance)
        assert figures["ranker_num_iterations"] == 2 and -1 <= figures["ranker_spearman"] <= 1


def test_bench_live_refuses_a_bad_ranker_file_before_its_server(monkeypatch, tmp_path):
    def no_server(*_, **__):
        raise AssertionError("a server was started")

    monkeypatch.setattr(experiments.bench_live, "start_server", no_server)
    spec = _live_spec(f"policies.ranker_path={tmp_path / 'gone.ranker'}")
    with pytest.raises(ValueError, match="policies.ranker_path: .*gone.ranker does not exist"):
        bench_live(spec, steps=1, out_dir=tmp_path / "bench")


def test_bench_live_records_every_modes_ranker_and_its_progress(
    monkeypatch, tmp_path, model_file, cost
):
    fake = FakeLive()
    monkeypatch.setattr(runtime.launcher, "run_live", fake)
    base = _live_spec(f"policies.ranker_path={model_file}", f"sim.cost_model=profiled:{cost}")
    steps: list = []
    bench_modes(base, "http://x", "t", tmp_path / "bench", rounds=1, on_step=steps.append)
    assert [source.startswith(_file_source(model_file)) for source in
            (p.source for p in fake.predictors)] == [True] * len(MODES)  # fmt: skip
    assert fake.calls == [(False, steps.append)] * len(MODES)
    for mode in MODES:
        metrics = json.loads((tmp_path / "bench" / "round-0" / mode / "metrics.json").read_text())
        assert metrics["ranker_source"].startswith(_file_source(model_file))


# -- tandem advise --------------------------------------------------------------------------


def test_advise_refuses_a_bad_ranker_file_before_the_search(tmp_path, text_model, capsys):
    gone = tmp_path / "gone.ranker"
    out = tmp_path / "advice"
    sets = [f"--set={o}" for o in [*SMALL, f"policies.ranker_path={gone}"]]
    code = main(["advise", "streamrl-7b", *sets, "--budget-s", "30", "--out", str(out)])
    assert code == 2 and not out.exists()
    said = _said(capsys)
    assert "policies.ranker_path:" in said and "gone.ranker does not exist" in said
    # the live check's twins and search are simulated: a text ranker is refused up front
    with pytest.raises(ValueError, match=r"policies.ranker_path: .*--no-text"):
        check_live_spec(_live_spec(f"policies.ranker_path={text_model}"))


class _Server:
    base_url = "http://127.0.0.1:1"


def _no_server(monkeypatch) -> None:
    import runtime.live_run
    import runtime.procs
    import runtime.profile_bursts

    monkeypatch.setattr(runtime.live_run, "model_dir_for", lambda *_: "tiny-model")
    monkeypatch.setattr(runtime.procs, "start_server", lambda *_, **__: _Server())
    monkeypatch.setattr(runtime.procs, "wait_healthy", lambda *_: None)
    monkeypatch.setattr(runtime.procs, "stop_server", lambda *_: None)
    monkeypatch.setattr(runtime.profile_bursts, "warm_up_server", lambda *_: None)


def test_the_advise_live_check_runs_with_the_specs_ranker_file(
    monkeypatch, tmp_path, model_file, cost
):
    """Seen: its live runs ranked with an empty online ranker, whatever the spec said."""
    fake = FakeLive()
    monkeypatch.setattr(runtime.launcher, "run_live", fake)
    _no_server(monkeypatch)
    base = _live_spec(f"policies.ranker_path={model_file}", f"sim.cost_model=profiled:{cost}")
    space = plan_space(base, SpaceOptions(axes=("predictor=ranker",)))
    the_input = space.input
    evals = [Evaluation(the_input, 3, {"throughput_samples_per_s": 1.0}, (), 0.0)]
    result = SearchResult([the_input], evals, the_input, 1.0, 0, 0, True, 0.0, {the_input: 1.0})
    advice = Advice(space, result, 1.0, the_input, 1.0, [], evals, "throughput", 60.0, 1.0)
    live_check(advice, LivePlan(top=1, repeats=1), tmp_path / "check")
    ((predictor,),) = [fake.predictors]
    assert predictor.source.startswith(_file_source(model_file))
    (case,) = (tmp_path / "check" / "cases").glob("config-*/repeat-0")
    for side in ("live", "sim"):
        metrics = json.loads((case / side / "metrics.json").read_text())
        assert metrics["ranker_source"].startswith(_file_source(model_file))


def test_the_advise_search_hands_each_run_its_own_history(model_file):
    """Its worker fits (or loads) a ranker once; each run records its own finished samples
    into a copy of it, never into one a run before it filled."""
    from experiments.advise_eval import _ranker

    spec = _spec(f"policies.ranker_path={model_file}")
    first = _ranker(spec)
    Simulation(spec, ranker=first).run()
    assert len(first.observations) == spec.run.iterations * spec.algorithm.batch_size
    second = _ranker(spec)
    assert second is not first and second.observations.empty
    assert second.fitted is first.fitted and second.source == first.source


def test_a_sweep_loads_a_ranker_file_its_points_share_once(monkeypatch, model_file):
    import experiments.ranker_source as source
    from experiments.sweep_point import check_point_specs

    loaded, real = [], source.load_ranker_file
    monkeypatch.setattr(source, "load_ranker_file", lambda p, live: loaded.append(p) or real(p, live))  # fmt: skip
    modes = ("stream-sync", "one-step-async", "stream-async")
    base = _spec(f"policies.ranker_path={model_file}")
    assert check_point_specs(base, [{"pipeline.mode": m} for m in modes]) == {}
    assert loaded == [str(model_file)]
