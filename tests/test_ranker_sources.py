"""Where a run's ranker comes from (``experiments.ranker_source``) and what the run says
of it: a model file of ``tandem ranker fit`` through ``policies.ranker_path`` (sim and
live, with clear errors for a bad file), a built-in sim fit that never sees the lengths
the run simulates, and the ranker's source and quality in run.log and metrics.json."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.ensemble import HistGradientBoostingRegressor

import experiments.ranker_source as source
import runtime.launcher
from experiments.cli import main
from experiments.predictors import ranker_for, task_trace, workload_trace
from experiments.ranker_source import CrossFitRanker
from experiments.specs import config_path
from policies.records import Request
from policies.spec import SpecError, load_spec
from ranker.features import history_features
from ranker.online import RankerPredictor
from ranker.traces import requests_frame
from sim.simulator import Simulation

SMALL = [
    "run.iterations=6", "workload.num_prompts=128", "algorithm.batch_size=64",
    "policies.length_predictor=ranker",
]  # fmt: skip


def _spec(*overrides: str):
    return load_spec(config_path("streamrl-7b"), [*SMALL, *overrides])


@pytest.fixture()
def model_file(tmp_path) -> Path:
    return fit_model_file(tmp_path)


def fit_model_file(tmp_path: Path) -> Path:
    """A ranker fitted with ``tandem ranker fit --no-text`` on a trace of another seed."""
    trace = tmp_path / "other.parquet"
    workload_trace(_spec("run.seed=7"), 6).to_parquet(trace)
    model = tmp_path / "my.ranker"
    assert main(["ranker", "fit", str(trace), "--out", str(model), "--no-text"]) == 0
    return model


def _run(tmp_path: Path, *overrides: str) -> tuple[int, Path]:
    out = tmp_path / "run"
    sets = [f"--set={o}" for o in [*SMALL, *overrides]]
    return main(["run", "streamrl-7b", "--out", str(out), *sets]), out


# -- L2: the eval file keeps the model file's whole name -----------------------------------


def test_eval_files_of_two_model_versions_do_not_collide(tmp_path):
    """Seen: ``a.v1`` and ``a.v2`` both wrote ``a.eval.json``."""
    trace = tmp_path / "other.parquet"
    workload_trace(_spec("run.seed=7"), 6).to_parquet(trace)
    for name in ("a.v1", "a.v2"):
        model = tmp_path / name
        assert main(["ranker", "fit", str(trace), "--out", str(model), "--before", "4"]) == 0
        assert main(["ranker", "eval", str(model), str(trace)]) == 0
    assert (tmp_path / "a.v1.eval.json").is_file() and (tmp_path / "a.v2.eval.json").is_file()
    assert not (tmp_path / "a.eval.json").exists()


# -- policies.ranker_path -------------------------------------------------------------------


def test_ranker_path_is_saved_absolute_and_needs_the_ranker(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = _spec("policies.ranker_path=my.ranker")
    assert spec.policies.ranker_path == str(tmp_path / "my.ranker")
    assert f"ranker_path: {tmp_path / 'my.ranker'}" in spec.to_yaml()
    with pytest.raises(SpecError, match="ranker_path is read only by length_predictor 'ranker'"):
        _spec("policies.length_predictor=oracle", "policies.ranker_path=my.ranker")


def test_a_sim_run_ranks_with_the_file_it_is_given(tmp_path, model_file):
    code, out = _run(tmp_path, f"policies.ranker_path={model_file}")
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["ranker_source"].startswith(f"file {model_file} ")
    assert metrics["ranker_spearman"] > 0.5 and metrics["ranker_predicted_share"] == 1.0
    assert f"ranker: file {model_file}" in (out / "run.log").read_text()
    assert load_spec(out / "spec.yaml").policies.ranker_path == str(model_file)
    # the run's predictions are the file's model on the run's own history: stream-async
    # never overlaps iterations, so the samples finished at a dispatch are all those of
    # the earlier iterations
    spec = _spec(f"policies.ranker_path={model_file}")
    from_file = RankerPredictor.load(model_file)
    from_file.replace_history(workload_trace(spec, spec.run.iterations))
    expected = Simulation(spec, ranker=_PredictOnly(from_file)).run().samples_frame()
    ran = pd.read_parquet(out / "samples.parquet")  # same predictions, sample by sample
    assert ran["predicted_output_tokens"].tolist() == pytest.approx(
        expected["predicted_output_tokens"].tolist(), rel=1e-12
    )


class _PredictOnly:
    """A ranker the simulator records nothing into: its history is what it was given."""

    def __init__(self, ranker: RankerPredictor) -> None:
        self.ranker = ranker

    def fit(self, requests, output_tokens) -> None:
        raise AssertionError("not fitted in a run")

    def predict(self, requests) -> list:
        return self.ranker.predict(requests)


def _refused(tmp_path: Path, path: Path, capsys) -> str:
    code, out = _run(tmp_path, f"policies.ranker_path={path}")
    assert code == 2 and not out.exists()  # refused before the run directory
    return capsys.readouterr().out


def test_a_missing_or_corrupt_model_file_is_refused_by_name(tmp_path, capsys):
    said = _refused(tmp_path, tmp_path / "nope.ranker", capsys)
    assert "policies.ranker_path:" in said and "does not exist" in said
    junk = tmp_path / "junk.ranker"
    junk.write_bytes(b"junk\n")
    said = _refused(tmp_path, junk, capsys)
    assert "not a tandem ranker file" in said.replace("\n", " ")
    other = tmp_path / "other.ranker"
    other.write_bytes(pickle.dumps({"format": "tandem-ranker", "format_version": 1}))
    said = _refused(tmp_path, other, capsys)
    assert "not a tandem ranker file" in said.replace("\n", " ")


def test_a_model_of_other_features_is_refused(tmp_path, model_file, capsys):
    ranker = RankerPredictor.load(model_file)
    trees = HistGradientBoostingRegressor(max_iter=2).fit(np.ones((30, 3)), np.arange(30.0))
    ranker.fitted.estimator._trees = trees  # a model of 3 features, as another build's
    bad = tmp_path / "bad.ranker"
    ranker.save(bad)
    said = _refused(tmp_path, bad, capsys).replace("\n", " ")
    assert "does not take the features this tandem computes" in said


def test_a_model_fitted_on_prompt_text_is_refused_in_the_sim(tmp_path, capsys):
    trace = tmp_path / "tasks.parquet"
    task_trace(0, 64, 128).to_parquet(trace)
    model = tmp_path / "text.ranker"
    assert main(["ranker", "fit", str(trace), "--out", str(model)]) == 0
    said = _refused(tmp_path, model, capsys).replace("\n", " ")
    assert "fitted on prompts with text" in said and "--no-text" in said


def test_a_live_run_gets_the_files_model_with_its_own_history(tmp_path, model_file):
    ranker = ranker_for(_spec(f"policies.ranker_path={model_file}"), live=True)
    assert isinstance(ranker, RankerPredictor) and ranker.fitted is not None
    assert ranker.observations.empty  # the file's trace is of other prompts
    fitted = ranker.fitted
    batch = workload_trace(_spec(), 1)
    requests = [
        Request(i, int(r.prompt_id), 0, 0, int(r.prompt_tokens), int(r.max_tokens))
        for i, r in enumerate(batch.itertuples())
    ]
    ranker.update(requests, batch["output_tokens"].tolist())  # records, keeps the model
    assert not ranker.refreshing and ranker.fitted is fitted
    assert len(ranker.observations) == len(batch)


def test_tandem_run_live_hands_the_launcher_the_files_ranker(monkeypatch, tmp_path, model_file):
    handed = []

    def fake_live(spec, out_dir, length_predictor=None, **_):
        handed.append(length_predictor)
        result = Simulation(spec, ranker=length_predictor).run()
        result.save(out_dir)
        return result

    monkeypatch.setattr(runtime.launcher, "run_live", fake_live)
    monkeypatch.setattr(runtime.launcher, "check_live_run", lambda spec, ray=None: None)
    out = tmp_path / "live"
    sets = [f"--set={o}" for o in [*SMALL, f"policies.ranker_path={model_file}"]]
    assert main(["run", "streamrl-7b", "--live", "--out", str(out), *sets]) == 0
    ((ranker,),) = [handed]
    assert ranker.source.startswith(f"file {model_file}") and not ranker.refit_online
    assert json.loads((out / "metrics.json").read_text())["ranker_source"] == ranker.source


# -- the built-in sim fit -------------------------------------------------------------------


def _fitted_traces(monkeypatch) -> list:
    traces = []
    real = RankerPredictor.fit_trace

    def spy(self, trace):
        traces.append((self, trace.copy()))
        real(self, trace)

    monkeypatch.setattr(RankerPredictor, "fit_trace", spy)
    return traces


def test_the_built_in_sim_ranker_is_not_fitted_on_the_runs_lengths(monkeypatch):
    """Seen: it was fitted on the run's first two epochs, then scored on them in the run."""
    spec = _spec()
    traces = _fitted_traces(monkeypatch)
    ranker = ranker_for(spec)
    ((_, fitted),) = traces
    run = workload_trace(spec, spec.run.iterations)
    assert len(fitted) == 4 * 64  # two epochs of two iterations
    same_rows = run.iloc[: len(fitted)]
    assert not np.array_equal(fitted["output_tokens"], same_rows["output_tokens"])
    corr = np.corrcoef(np.log(fitted["output_tokens"]), np.log(same_rows["output_tokens"]))
    assert abs(corr[0, 1]) < 0.3  # held-out draws: independent of the run's lengths
    assert ranker.observations.empty  # the run records its samples as they finish
    assert "held-out draws" in ranker.source


def test_a_trace_workload_is_ranked_by_the_model_of_the_other_half(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    rows = [(p, 100, int(x)) for p in range(16) for x in rng.integers(10, 900, 4)]
    trace = tmp_path / "trace.csv"
    trace.write_text("prompt_id,prompt_tokens,output_tokens\n" + "".join(
        f"{p},{t},{o}\n" for p, t, o in rows
    ))  # fmt: skip
    spec = _spec("workload.kind=trace", f"workload.trace_path={trace}", "workload.num_prompts=16")
    traces = _fitted_traces(monkeypatch)
    ranker = ranker_for(spec)
    assert isinstance(ranker, CrossFitRanker) and len(traces) == 2
    seen = {id(model): set(t["prompt_id"]) for model, t in traces}
    for prompt, fold in ranker.fold_of.items():
        assert prompt not in seen[id(ranker.models[1 - fold])]  # its ranker never saw it
    result = Simulation(spec, ranker=ranker).run()
    assert all(s.predicted_output_tokens is not None for s in result.samples)


# -- run.log and metrics.json -------------------------------------------------------------


def test_a_run_says_how_its_ranker_was_fitted_and_how_well_it_ranked(tmp_path):
    code, out = _run(tmp_path)
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["ranker_source"].startswith("in-run fit: hgb on held-out draws")
    assert metrics["ranker_num_iterations"] == 6
    for key in ("ranker_spearman", "ranker_recall_20", "ranker_recall_10", "ranker_recall_5"):
        assert 0 < metrics[key] <= 1
    log = (out / "run.log").read_text()
    assert "ranker: in-run fit: hgb on held-out draws" in log
    assert "ranker quality on the run's own samples: Spearman " in log


def test_a_missing_model_file_is_refused_by_ranker_for_too(tmp_path):
    with pytest.raises(ValueError, match="policies.ranker_path: .* does not exist"):
        source.ranker_for(_spec(f"policies.ranker_path={tmp_path / 'gone'}"))


# -- the history a sim request is ranked on ----------------------------------------------------


def test_a_sim_request_is_ranked_on_the_samples_finished_before_its_dispatch(monkeypatch):
    """Seen: the history was the run's whole trace, so in a mode that overlaps iterations
    a request also saw earlier samples of its prompt still running (one iteration an
    epoch: every prompt recurs in the next iteration)."""
    spec = _spec("pipeline.mode=pipeline", "workload.num_prompts=64")
    counts: dict[int, float] = {}  # sample id -> history rows its prediction saw
    real = RankerPredictor.predict

    def spy(self, requests):
        seen = history_features(self.observations, requests_frame(requests))[:, 0]
        counts.update(zip([r.sample_id for r in requests], np.nan_to_num(seen), strict=True))
        return real(self, requests)

    monkeypatch.setattr(RankerPredictor, "predict", spy)
    samples = Simulation(spec, ranker=ranker_for(spec)).run().samples_frame()
    by_prompt = dict(list(samples.groupby("prompt_id")))
    late = 0
    for s in samples.itertuples():
        earlier = by_prompt[s.prompt_id]
        earlier = earlier[earlier["iteration"] < s.iteration]
        finished = (earlier["gen_end_s"] <= s.dispatch_s).sum()
        assert counts[s.sample_id] == finished, s
        late += len(earlier) - finished
    assert late > 0  # samples still running at a later dispatch of their prompt
