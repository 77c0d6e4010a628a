"""Fitting the roofline's efficiency factors to a measured decode profile.

Only efficiency factors are fitted; everything else comes from the hardware and model
tables. ``fit_ptl_profile`` fits ``step_overhead_s`` and ``decode_compute`` (with
``decode_memory`` held at its assumed value) to a ``batch_size, decode_step_ms`` table by
least squares on log time, i.e. on relative error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from policies.protocols import Device
from policies.spec import EfficiencySection
from sim.costs import RooflineCostModel
from sim.tables import data_path, model


@dataclass(slots=True, frozen=True)
class PtlFit:
    efficiency: EfficiencySection
    batch_sizes: tuple[int, ...]
    measured_ms: tuple[float, ...]
    predicted_ms: tuple[float, ...]

    @property
    def max_relative_error(self) -> float:
        m, p = np.asarray(self.measured_ms), np.asarray(self.predicted_ms)
        return float(np.max(np.abs(p / m - 1)))


def predict_ptl_ms(
    eff: EfficiencySection, model_name: str, hardware: str, batch_sizes: np.ndarray
) -> np.ndarray:
    cost = RooflineCostModel(model(model_name), eff, "grpo")
    device = Device(hardware, 1)
    return np.array([cost.decode_step_s(device, int(n), 0) * 1e3 for n in batch_sizes])


def fit_ptl_profile(
    table: Path | None = None,
    model_name: str = "Qwen2.5-7B",
    hardware: str = "H800",
    base: EfficiencySection | None = None,
) -> PtlFit:
    """Fit overhead and decode compute efficiency to a PTL profile (StreamRL Fig. 6 default)."""
    frame = pd.read_csv(table or data_path("ptl_7b_h800.csv"))
    n = frame["batch_size"].to_numpy(int)
    measured = frame["decode_step_ms"].to_numpy(float)
    base = base or EfficiencySection()

    def with_params(x: np.ndarray) -> EfficiencySection:
        return base.model_copy(
            update={"step_overhead_s": float(x[0]), "decode_compute": float(x[1])}
        )

    def residual(x: np.ndarray) -> np.ndarray:
        return np.log(predict_ptl_ms(with_params(x), model_name, hardware, n)) - np.log(measured)

    fit = least_squares(residual, [0.003, 0.3], bounds=([0.0, 0.01], [0.05, 1.0]))
    eff = with_params(fit.x)
    predicted = predict_ptl_ms(eff, model_name, hardware, n)
    return PtlFit(
        eff, tuple(map(int, n)), tuple(map(float, measured)), tuple(map(float, predicted))
    )
