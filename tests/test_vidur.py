"""The roofline's GEMM calibration from Vidur-format operator profiles (issue #14 item 4):
synthetic profiles from known efficiencies are recovered, held out per GPU and operator,
written by ``tandem calibrate --from vidur`` and loaded by ``sim.cost_model: roofline:DIR``."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from helpers import small_spec

from experiments.cli import main
from sim.costs import build_cost_model, describe_cost_model
from sim.tables import hardware
from sim.vidur import (
    GEMM_OPERATORS,
    VIDUR_GPUS,
    calibrate_vidur,
    fit_gemm_efficiency,
    gemm_params,
    load_vidur_gemms,
)

TRUE = {"compute": 0.7, "memory": 0.85, "p": 1.3, "latency_s": 6e-6}


def _write_profile(root, gpu: str, model: str, noise: float = 0.0, seed: int = 0) -> None:
    """A Vidur mlp.csv whose times follow the smooth-max law with TRUE's terms."""
    hw = hardware(VIDUR_GPUS[gpu])
    rng = np.random.default_rng(seed)
    rows = []
    for tp in (1, 2):
        for tokens in (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096):
            row = {"n_head": 32, "n_kv_head": 8, "n_embd": 4096, "n_expanded_embd": 14336,
                   "vocab_size": 32000, "use_gated_mlp": True, "num_tokens": tokens,
                   "num_tensor_parallel_workers": tp}  # fmt: skip
            frame = pd.DataFrame([row])
            for op in GEMM_OPERATORS:
                params = float(gemm_params(frame, op).iloc[0])
                c = 2 * params * tokens / (hw.bf16_flops * TRUE["compute"])
                m = 2 * params / (hw.hbm_bytes_per_s * TRUE["memory"])
                t = (c ** TRUE["p"] + m ** TRUE["p"]) ** (1 / TRUE["p"]) + TRUE["latency_s"]
                row[f"time_stats.{op}.median"] = 1e3 * t * (1 + noise * rng.standard_normal())
            rows.append(row)
    path = root / "compute" / gpu / model / "mlp.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, index=False)


@pytest.fixture
def profiles(tmp_path):
    for gpu in VIDUR_GPUS:
        _write_profile(tmp_path, gpu, "org/model-8b", noise=0.02, seed=len(gpu))
    return tmp_path


def test_the_fit_recovers_the_terms_that_made_the_profile(profiles):
    frame = load_vidur_gemms(profiles)
    assert set(frame["gpu"]) == set(VIDUR_GPUS) and set(frame["operator"]) == set(GEMM_OPERATORS)
    fit = fit_gemm_efficiency(frame[frame["gpu"] == "h100"])
    assert fit.gemm_compute == pytest.approx(TRUE["compute"], rel=0.03)
    assert fit.gemm_memory == pytest.approx(TRUE["memory"], rel=0.03)
    assert fit.gemm_overlap == pytest.approx(TRUE["p"], rel=0.1)


def test_heldout_error_per_gpu_and_operator_names_the_best_form(profiles):
    cal = calibrate_vidur(profiles)
    other_gpu = cal.heldout[
        (cal.heldout["split"] == "held-out GPU") & (cal.heldout["fitted_on"] == "h100")
    ]
    by_form = other_gpu.groupby("form")["median"].mean()
    assert set(other_gpu["operator"]) == set(GEMM_OPERATORS) and set(other_gpu["gpu"]) == {"a100"}
    assert by_form["smooth-max"] < 0.03  # the profile's own law carries across GPUs
    assert by_form["smooth-max"] < by_form["sum"] and by_form["smooth-max"] < by_form["max"]


def test_calibrate_from_vidur_writes_efficiencies_the_roofline_loads(profiles, tmp_path, capsys):
    out = tmp_path / "cal"
    assert main(["calibrate", str(profiles), "--from", "vidur", "--out", str(out)]) == 0
    eff = json.loads((out / "efficiency.json").read_text())
    assert eff["gemm_compute"] == pytest.approx(TRUE["compute"], rel=0.03)
    assert {"heldout.csv", "report.md"} <= {p.name for p in out.iterdir()}
    spec = small_spec(sim__cost_model=f"roofline:{out}")
    assert build_cost_model(spec).eff.gemm_compute == pytest.approx(eff["gemm_compute"])
    assert "calibrated from" in describe_cost_model(spec)
    assert "roofline-only" in describe_cost_model(small_spec())


def test_a_directory_without_profiles_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no Vidur mlp.csv"):
        load_vidur_gemms(tmp_path)
    with pytest.raises(ValueError, match="sim.cost_model: .* does not exist"):
        build_cost_model(small_spec(sim__cost_model=f"roofline:{tmp_path}"))


@pytest.mark.parametrize("text", ["", "{}", "[1, 2]"])
def test_an_efficiency_file_that_is_none_names_the_key_and_the_file(tmp_path, text):
    (tmp_path / "efficiency.json").write_text(text)
    with pytest.raises(ValueError, match=rf"^sim\.cost_model: {tmp_path}/efficiency\.json: not"):
        build_cost_model(small_spec(sim__cost_model=f"roofline:{tmp_path}"))
