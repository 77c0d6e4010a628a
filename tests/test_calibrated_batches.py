"""A calibrated cost model knows the largest decode batch its profile measured, and a run
whose ``max_num_seqs`` exceeds it is told that its steps are the fit extrapolated (a fit
on ``1, n, n²`` from batches up to 64 made a token dearer at 256 than at 64, and the
simulator priced it so without a word). ``tandem profile --batch-sizes`` measures the
batches a run needs, and refuses those its server would queue."""

from __future__ import annotations

import json
import logging

import pytest
from helpers import write_profile

import runtime.profiler
from experiments.cli import main
from experiments.specs import config_path
from policies.calibrated import CalibratedCosts, ProfileTarget
from policies.spec import load_spec
from runtime.profile_plan import ProfilePlan
from sim.calibration import calibrate_profile, cost_model_document

SETUP = {
    "model": {"name": "tiny"},
    "hardware": {"kind": "cpu", "tp": 1},
    "trainer": {"hardware": "cpu", "num_gpus": 1},
}


def _cost_model(tmp_path) -> dict:
    profile = write_profile(tmp_path, SETUP)  # decode.csv measures batches 1..64
    document = cost_model_document(calibrate_profile(tmp_path), profile)
    (tmp_path / "cost_model.json").write_text(json.dumps(document))
    return document


def _target(max_num_seqs: int) -> ProfileTarget:
    spec = load_spec(
        config_path("live-tiny"), [f"cluster.generation.0.max_num_seqs={max_num_seqs}"]
    )
    return ProfileTarget.of(spec, "sim.cost_model")


def test_calibrate_records_the_batches_and_contexts_it_measured(tmp_path):
    document = _cost_model(tmp_path)
    assert document["measured_range"]["decode"] == {
        "batch_size": [1.0, 64.0], "context_tokens": [20.0, 2500.0],
    }  # fmt: skip
    assert CalibratedCosts.load(tmp_path / "cost_model.json").measured_decode_batch == 64


def test_a_pool_beyond_the_measured_batches_is_warned_of_by_key(tmp_path, caplog):
    _cost_model(tmp_path)
    path = tmp_path / "cost_model.json"
    with caplog.at_level(logging.WARNING, logger="policies.calibrated"):
        CalibratedCosts.load(path, _target(64))
        assert not caplog.records
        CalibratedCosts.load(path, _target(256))
    (record,) = caplog.records
    text = record.getMessage()
    assert text.startswith("cluster.generation.0.max_num_seqs: 256, but ")
    assert "at most 64" in text and "--batch-sizes ...,256" in text


def test_an_older_cost_model_falls_back_to_its_profiles_plan(tmp_path, caplog):
    document = _cost_model(tmp_path)
    del document["measured_range"]
    document["source"]["plan"] = {"batch_sizes": [1, 3, 10, 20]}
    path = tmp_path / "cost_model.json"
    path.write_text(json.dumps(document))
    assert CalibratedCosts.load(path).measured_decode_batch == 20
    del document["source"]["plan"]
    path.write_text(json.dumps(document))
    with caplog.at_level(logging.WARNING, logger="policies.calibrated"):
        assert CalibratedCosts.load(path, _target(256)).measured_decode_batch is None
    assert not caplog.records  # nothing recorded, nothing claimed


def test_a_fit_whose_token_grows_dearer_past_the_profile_says_so(tmp_path, caplog):
    document = _cost_model(tmp_path)
    document["operators"]["decode"] = {
        "bases": ["1", "n", "n^2", "ctx"],
        "coefs": [0.01, 1e-4, 1e-5, 1e-6],
        "heldout_mape": 0.01,
    }  # fmt: skip
    # a token is cheapest at ~32 sequences
    path = tmp_path / "cost_model.json"
    path.write_text(json.dumps(document))
    with caplog.at_level(logging.WARNING, logger="policies.calibrated"):
        CalibratedCosts.load(path, _target(256))
    assert "whose cost a token rises past the measured batches" in caplog.text


def test_profile_batch_sizes_choose_the_decode_grid_and_its_contended_points():
    plan = ProfilePlan().with_batch_sizes((64, 1, 8, 128, 8))
    assert plan.batch_sizes == (1, 8, 64, 128)
    assert plan.contended_batch_sizes == (1, 64, 128)
    plan.check_batches(128)
    with pytest.raises(ValueError, match=r"--batch-sizes: 128 exceeds .*max_num_seqs 64"):
        plan.check_batches(64)


def test_profile_refuses_batches_its_server_would_queue_before_anything_starts(
    tmp_path, monkeypatch, capsys
):
    def refuse(*args, **kwargs):
        raise AssertionError("started before the batch sizes were checked")

    monkeypatch.setattr(runtime.profiler, "start_server", refuse)
    out = tmp_path / "prof"
    assert main(["profile", "--batch-sizes", "1,8,128", "--out", str(out)]) == 2
    said = " ".join(capsys.readouterr().out.split())
    assert "--batch-sizes: 128 exceeds the server's cluster.generation.0.max_num_seqs 64" in said
    assert not out.exists()
    with pytest.raises(SystemExit):
        main(["profile", "--batch-sizes", "1,0", "--out", str(out)])
    assert "expected an integer >= 1, got 0" in capsys.readouterr().err
