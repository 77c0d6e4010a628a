"""Which fits a profile's inputs can tell apart: a table measured at one value of an input
cannot separate a fixed cost from a per-unit one (docs/fidelity.md, "Bringing your own
profile"); where a constant is a candidate, one value fits a constant instead."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import write_profile

from sim.calibration import calibrate_operator

SETUP = {
    "model": {"name": "Qwen2.5-7B"},
    "hardware": {"kind": "H800", "tp": 1},
    "trainer": {"hardware": "H800", "num_gpus": 2},
}


def _calibrate(profile: Path):
    from experiments.calibrate import calibrate

    return calibrate(profile, profile.parent / "out", note=lambda text: None)


def _profile(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    write_profile(path, SETUP)
    return path


def _one_size(path: Path, column: str, value: float) -> None:
    frame = pd.read_csv(path)
    frame[column] = value
    frame.to_csv(path, index=False)


@pytest.mark.parametrize(
    ("table", "column", "message"),
    [
        ("prefill.csv", "num_tokens", r"prefill.csv: column num_tokens: every row has 4096; "
         r"the prefill fit needs at least 2 distinct token counts"),
        ("train.csv", "num_tokens", r"train.csv: column num_tokens: every row has 4096; the "
         r"forward fit needs at least 2 distinct token counts"),
        ("decode.csv", "batch_size", r"decode.csv: column batch_size: every row has 4096; the "
         r"decode fit needs at least 2 distinct batch sizes"),
    ],
)  # fmt: skip
def test_a_table_of_one_size_is_refused_naming_file_and_column(tmp_path, table, column, message):
    profile = _profile(tmp_path / "p")
    _one_size(profile / table, column, 4096)
    with pytest.raises(ValueError, match=message):
        _calibrate(profile)
    assert not (tmp_path / "out" / "cost_model.json").exists()


def test_prefill_at_one_size_is_not_fitted_as_all_per_token():
    # the user trial: 0.004 + 3.5e-5 n s measured at n = 4096 only came out [0, 4.36e-5]
    frame = pd.DataFrame({"num_tokens": [4096] * 6, "prefill_s": 0.004 + 3.5e-5 * 4096})
    with pytest.raises(ValueError, match=r"column num_tokens: .*fixed cost from its per-token"):
        calibrate_operator("prefill", frame, "prefill.csv")


def test_weight_sync_at_the_model_size_fits_constants(tmp_path):
    fits = _calibrate(_profile(tmp_path / "p"))  # weight_sync.csv: one num_bytes
    for name in ("weight_transfer", "weight_pause"):
        assert fits[name].fit.bases == ("1",)
        assert set(fits[name].candidates) == {"1", "1 (median)"}  # 1+bytes: not identifiable
    assert fits["weight_transfer"].fit(bytes=5e9) == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("name", "frame"),
    [
        ("decode_slowdown", {"batch_size": [20] * 4, "slowdown": [1.2, 1.3, 1.25, 1.3]}),
        ("train_slowdown", {"num_tokens": [512] * 3, "slowdown": [1.5, 1.6, 1.55]}),
    ],
)
def test_a_contention_table_of_one_size_fits_a_constant(name, frame):
    c = calibrate_operator(name, pd.DataFrame(frame))
    assert c.fit.bases == ("1",)
    assert c.fit() == pytest.approx(np.median(frame["slowdown"]), rel=0.05)


def test_a_quadratic_needs_three_distinct_sizes():
    tokens = np.array([100, 100, 100, 800, 800, 800])
    frame = pd.DataFrame({"num_tokens": tokens, "forward_s": 0.01 + 5e-5 * tokens})
    c = calibrate_operator("forward", frame)
    assert not any("tokens^2" in name for name in c.candidates)
    assert c.fit.bases == ("1", "tokens")
    assert c.fit(tokens=400) == pytest.approx(0.01 + 5e-5 * 400, rel=1e-6)


def test_decode_at_one_context_per_batch_size_drops_the_context_term():
    n = np.array([1, 4, 16, 64])
    frame = pd.DataFrame({"batch_size": n, "context_tokens": 500, "step_s": 0.004 + 2e-4 * n})
    c = calibrate_operator("decode", frame)
    assert not any("ctx" in name for name in c.candidates)
    assert c.fit.bases == ("1", "n")


def test_profile_refuses_one_batch_size_that_calibrate_could_not_fit():
    from runtime.profile_plan import ProfilePlan

    with pytest.raises(ValueError, match=r"--batch-sizes: one batch size \(8\); .*at least 2"):
        ProfilePlan().with_batch_sizes((8, 8))
