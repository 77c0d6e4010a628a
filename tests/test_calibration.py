"""Calibration: the roofline fit to StreamRL's PTL profile and the per-operator fits."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from helpers import write_profile

from policies.protocols import Device
from policies.sim_section import EfficiencySection
from sim.calibrated import CalibratedCostModel
from sim.calibration import (
    OPERATOR_TABLES,
    calibrate_operator,
    calibrate_profile,
    cost_model_document,
    fit_ptl_profile,
)


def test_roofline_fit_reproduces_every_ptl_point_within_4_percent():
    fit = fit_ptl_profile()
    assert len(fit.batch_sizes) >= 5
    assert fit.max_relative_error <= 0.04


def test_shipped_efficiency_defaults_are_the_ptl_fit():
    fit = fit_ptl_profile()
    default = EfficiencySection()
    assert fit.efficiency.step_overhead_s == pytest.approx(default.step_overhead_s, rel=0.02)
    assert 500 <= fit.context_tokens <= 4000  # the profile's (unstated) context per sequence


def test_operator_fit_recovers_an_affine_law_with_small_heldout_error():
    n = np.array([1, 2, 4, 8, 16, 32, 48, 64])
    ctx = np.array([900, 30, 400, 80, 2000, 600, 3000, 1200])  # not collinear with n
    frame = pd.DataFrame(
        {"batch_size": n, "context_tokens": ctx, "step_s": 0.004 + 0.0002 * n + 1e-7 * ctx}
    )
    c = calibrate_operator("decode", frame)
    assert c.fit.heldout_mape < 1e-6
    assert c.fit(n=10, ctx=500) == pytest.approx(0.004 + 0.002 + 5e-5, rel=1e-6)
    names = {"+".join(b) for b in OPERATOR_TABLES["decode"][3]}
    assert set(c.candidates) == names | {f"{b} (median)" for b in names}
    assert c.estimator == "least-squares"  # exact data: a tie, the plain fit wins


def test_one_sided_timing_spikes_pick_the_median_fit():
    tokens = np.array([26, 34, 46, 82, 115, 81, 214, 242, 356, 352, 357, 335])
    forward_s = 0.001 + 3e-5 * tokens
    forward_s[[4, 6, 8]] *= [2.0, 3.5, 2.5]  # interference only ever adds time
    c = calibrate_operator("forward", pd.DataFrame({"num_tokens": tokens, "forward_s": forward_s}))
    assert c.estimator == "median"
    assert c.fit(tokens=200) == pytest.approx(0.001 + 3e-5 * 200, rel=0.02)
    assert all(v >= 0 for v in c.fit.coefs)


def test_operator_fit_names_missing_columns():
    with pytest.raises(ValueError, match="context_tokens"):
        calibrate_operator("decode", pd.DataFrame({"batch_size": [1, 2], "step_s": [1.0, 2.0]}))


def test_calibrate_names_a_directory_without_a_profile(tmp_path, capsys):
    from experiments.cli import main

    assert main(["calibrate", str(tmp_path), "--out", str(tmp_path / "fit")]) == 2
    assert f"{tmp_path}: no profile.json" in " ".join(capsys.readouterr().out.split())
    assert not (tmp_path / "fit" / "cost_model.json").exists()


def _write_profile(path) -> dict:
    return write_profile(path, PROFILED_SETUP)


# what a profile.json must say it measured
PROFILED_SETUP = {
    "model": {"name": "tiny"},
    "hardware": {"kind": "cpu", "tp": 1},
    "trainer": {"hardware": "cpu", "num_gpus": 1},
}


def test_calibrated_cost_model_round_trips_and_predicts_the_profile(tmp_path):
    profile = _write_profile(tmp_path)
    fits = calibrate_profile(tmp_path)
    (tmp_path / "cost_model.json").write_text(json.dumps(cost_model_document(fits, profile)))
    cost = CalibratedCostModel.load(tmp_path / "cost_model.json")
    device = Device("cpu", 1)
    assert cost.train_s(device, 400) == pytest.approx(0.025 + 13e-5 * 400, rel=1e-6)
    assert cost.optimizer_s(device) == pytest.approx(0.012)
    assert cost.kv_capacity_tokens(device) == 100000
    # the push (0.2 s) contains the server's pause (0.12 s): load = pause, transfer = the rest
    assert cost.weight_load_s(device) == pytest.approx(0.12)
    assert cost.weight_transfer_s(1e6, 0.0, 0.0) == pytest.approx(0.08)
    for c in fits.values():
        assert c.fit.heldout_mape < 0.1


def test_decode_under_training_is_fitted_when_profiled_and_absent_otherwise(tmp_path):
    profile = _write_profile(tmp_path)
    device = Device("cpu", 1)
    fits = calibrate_profile(tmp_path)
    assert "decode_slowdown" not in fits  # an older profile: no such table
    (tmp_path / "cost_model.json").write_text(json.dumps(cost_model_document(fits, profile)))
    assert (
        CalibratedCostModel.load(tmp_path / "cost_model.json").contended_decode_law(device, 8)
        is None
    )

    pd.DataFrame(
        {"batch_size": [3, 3, 20, 20, 64, 64], "max_tokens": [24, 112] * 3,
         "slowdown": [1.5, 1.5, 1.5, 1.5, 1.5, 1.5]}
    ).to_csv(tmp_path / "decode_contended.csv", index=False)  # fmt: skip
    fits = calibrate_profile(tmp_path)
    (tmp_path / "cost_model.json").write_text(json.dumps(cost_model_document(fits, profile)))
    cost = CalibratedCostModel.load(tmp_path / "cost_model.json")
    free, busy = cost.decode_law(device, 20), cost.contended_decode_law(device, 20)
    assert busy is not None
    assert busy.step(700) == pytest.approx(1.5 * free.step(700), rel=0.02)


def test_training_under_generation_is_fitted_when_profiled(tmp_path):
    profile = _write_profile(tmp_path)
    device = Device("cpu", 1)
    fits = calibrate_profile(tmp_path)
    (tmp_path / "cost_model.json").write_text(json.dumps(cost_model_document(fits, profile)))
    assert (
        CalibratedCostModel.load(tmp_path / "cost_model.json").contended_train_s(device, 400)
        is None
    )
    pd.DataFrame({"num_tokens": [100, 300, 600], "slowdown": [1.4, 1.4, 1.4]}).to_csv(
        tmp_path / "train_contended.csv", index=False
    )
    fits = calibrate_profile(tmp_path)
    (tmp_path / "cost_model.json").write_text(json.dumps(cost_model_document(fits, profile)))
    cost = CalibratedCostModel.load(tmp_path / "cost_model.json")
    assert cost.contended_train_s(device, 400) == pytest.approx(1.4 * cost.train_s(device, 400))


# -- one calibrated model for sim and live ---------------------------------------------------


def test_the_shared_calibrated_model_prices_decode_as_the_sim_adapter_does(tmp_path):
    from helpers import write_cost_model

    from policies.calibrated import CalibratedCosts

    path = write_cost_model(tmp_path) / "cost_model.json"
    pure, sim = CalibratedCosts.load(path), CalibratedCostModel.load(path)
    device = Device("cpu", 1)
    for n, ctx in [(1, 0), (8, 500), (64, 9000)]:
        expected = 0.008 + 2e-4 * n + 1e-7 * ctx  # helpers.TINY_OPERATORS' decode
        assert pure.decode_step_s(device, n, ctx) == pytest.approx(expected, rel=1e-12)
        assert sim.decode_step_s(device, n, ctx) == pytest.approx(expected, abs=1e-11)  # ticks
    assert pure.train_s(device, 100) == sim.train_s(device, 100)
    assert pure.weight_load_s(device) == sim.weight_load_s(device)


def test_live_dispatch_prices_with_the_calibrated_model_when_one_is_configured(tmp_path):
    from helpers import small_spec, write_cost_model

    from policies.calibrated import CalibratedCosts
    from policies.dispatch import SkewnessAwareDispatch
    from runtime.cost import TinyCostModel
    from runtime.live_run import live_policies
    from runtime.tasks import TaskPromptSource, TaskSet

    tasks = TaskSet(0, 64, 64)
    prompts = TaskPromptSource(tasks, 8, 2)
    cost_dir = write_cost_model(tmp_path / "cm")
    calibrated = small_spec(policies__dispatch="skewness-aware", live__cost_model=str(cost_dir))
    dispatch = live_policies(calibrated, tasks, prompts, 2).dispatch
    assert isinstance(dispatch, SkewnessAwareDispatch)
    assert isinstance(dispatch._cost, CalibratedCosts)
    assert dispatch._cost.decode_step_s(Device("cpu", 1), 8, 500) == pytest.approx(
        0.008 + 2e-4 * 8 + 1e-7 * 500
    )
    plain = small_spec(policies__dispatch="skewness-aware")  # the documented fallback
    assert isinstance(live_policies(plain, tasks, prompts, 2).dispatch._cost, TinyCostModel)
    missing = small_spec(live__cost_model=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="live.cost_model"):
        live_policies(missing, tasks, prompts, 2)


@pytest.mark.parametrize(
    ("table", "text", "message"),
    [
        ("decode.csv", "batch_size,context_tokens,step_s\n1,20,abc\n4,90,0.009\n",
         r"decode.csv: column step_s, row 1: 'abc' is not a finite number$"),
        ("decode.csv", "batch_size,context_tokens,step_s\n1,20,0.008\n,90,0.009\n",
         r"decode.csv: column batch_size, row 2: empty$"),
        ("prefill.csv", "", r"prefill.csv: empty file"),
    ],
)  # fmt: skip
def test_a_malformed_table_is_named_with_its_column_and_row(tmp_path, table, text, message):
    from experiments.calibrate import calibrate

    _write_profile(tmp_path)
    (tmp_path / table).write_text(text)
    with pytest.raises(ValueError, match=message):
        calibrate(tmp_path, tmp_path / "fit")


def test_a_profile_json_without_weight_bytes_is_named(tmp_path):
    from experiments.calibrate import calibrate

    _write_profile(tmp_path)
    (tmp_path / "profile.json").write_text(json.dumps({"kv_capacity_tokens": 100000}))
    with pytest.raises(ValueError, match=r"profile.json: no weight_bytes"):
        calibrate(tmp_path, tmp_path / "fit")
    assert not (tmp_path / "fit").exists()  # checked before fitting


def test_an_older_contended_decode_table_is_skipped_with_a_note(tmp_path):
    from experiments.calibrate import calibrate

    _write_profile(tmp_path)
    pd.DataFrame(  # before the slowdown column: contended step times only
        {"batch_size": [3, 3, 20, 20], "context_tokens": [56, 188, 60, 190],
         "step_s": [0.010, 0.011, 0.014, 0.015], "max_tokens": [24, 112] * 2}
    ).to_csv(tmp_path / "decode_contended.csv", index=False)  # fmt: skip
    notes: list[str] = []
    fits = calibrate(tmp_path, tmp_path / "fit", notes.append)
    assert "decode_slowdown" not in fits and "decode" in fits
    assert notes == [
        f"decode_slowdown not calibrated: {tmp_path / 'decode_contended.csv'} is in an older "
        "profile format (no column slowdown); profile again to calibrate it"
    ]


def test_calibrating_again_removes_parity_plots_of_operators_it_no_longer_has(tmp_path):
    from experiments.calibrate import calibrate

    _write_profile(tmp_path)
    pd.DataFrame(
        {"batch_size": [3, 3, 20, 20, 64, 64], "max_tokens": [24, 112] * 3,
         "slowdown": [1.5, 1.4, 1.5, 1.6, 1.5, 1.5]}
    ).to_csv(tmp_path / "decode_contended.csv", index=False)  # fmt: skip
    calibrate(tmp_path, tmp_path / "fit")
    assert (tmp_path / "fit" / "parity-decode_slowdown.png").exists()
    (tmp_path / "decode_contended.csv").unlink()
    fits = calibrate(tmp_path, tmp_path / "fit")
    assert sorted(p.name for p in (tmp_path / "fit").glob("parity-*.png")) == sorted(
        f"parity-{name}.png" for name in fits
    )


def _tiny_cpu_profile(tmp_path):
    """A cost model that records its source as ``tandem calibrate`` does: tiny on a CPU."""
    from helpers import write_cost_model

    path = write_cost_model(tmp_path / "cm") / "cost_model.json"
    doc = json.loads(path.read_text())
    doc["source"] = {"model": {"name": "tiny"}, "hardware": {"kind": "cpu", "num_cores": 2}}
    path.write_text(json.dumps(doc))
    return path.parent


def test_a_profile_of_another_model_or_hardware_is_refused(tmp_path):
    from experiments.specs import config_path
    from policies.spec import load_spec
    from sim.costs import build_cost_model

    cost = _tiny_cpu_profile(tmp_path)
    qwen = load_spec(config_path("streamrl-7b"), [f"sim.cost_model=profiled:{cost}"])
    with pytest.raises(ValueError, match=r"sim.cost_model: .*model 'tiny'.*'Qwen2.5-7B'"):
        build_cost_model(qwen)
    on_h800 = load_spec(config_path("streamrl-7b"), [f"sim.cost_model=profiled:{cost}",
                                                     "model.name=tiny"])  # fmt: skip
    with pytest.raises(ValueError, match=r"sim.cost_model: .*hardware 'cpu'.*'H800'"):
        build_cost_model(on_h800)
    live_tiny = load_spec(config_path("live-tiny"), [f"sim.cost_model=profiled:{cost}"])
    assert isinstance(build_cost_model(live_tiny), CalibratedCostModel)  # its own machine
