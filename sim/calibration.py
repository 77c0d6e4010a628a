"""Fitting the cost models to measured profiles.

* ``fit_ptl_profile``: the roofline's ``step_overhead_s`` from a measured decode profile
  (``batch_size, decode_step_ms``; StreamRL's Fig. 6 by default), with the GEMM
  efficiencies held at their values (fitted to Vidur's GEMM profiles, ``sim.vidur``) and
  the KV bandwidth at its assumed value. The profile does not say how much context its
  sequences held, so that is fitted too (``context_tokens`` per sequence); both by least
  squares on log time, i.e. on relative error.
* ``calibrate_profile``: the live runtime's operators from a ``tandem profile``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from policies.calibrated import (
    BASES,
    COST_MODEL_FORMAT,
    COST_MODEL_VERSION,
    OPTIONAL_OPERATORS,
    OperatorFit,
)
from policies.protocols import Device
from policies.sim_section import EfficiencySection
from sim.costs import RooflineCostModel
from sim.models import model
from sim.profile_checks import (
    check_measurements,
    check_weight_sync,
    decode_warnings,
    inseparable_error,
)
from sim.tables import data_path


@dataclass(slots=True, frozen=True)
class PtlFit:
    efficiency: EfficiencySection
    context_tokens: float  # per sequence, in the profiled steps (fitted)
    batch_sizes: tuple[int, ...]
    measured_ms: tuple[float, ...]
    predicted_ms: tuple[float, ...]

    @property
    def max_relative_error(self) -> float:
        m, p = np.asarray(self.measured_ms), np.asarray(self.predicted_ms)
        return float(np.max(np.abs(p / m - 1)))


def predict_ptl_ms(
    eff: EfficiencySection,
    model_name: str,
    hardware: str,
    batch_sizes: np.ndarray,
    context_tokens: float = 0.0,
) -> np.ndarray:
    """Decode step (ms) of each batch size, every sequence holding ``context_tokens``."""
    cost = RooflineCostModel(model(model_name), eff, "grpo")
    device = Device(hardware, 1)
    return np.array(
        [cost.decode_step_s(device, int(n), int(n * context_tokens)) * 1e3 for n in batch_sizes]
    )


def fit_ptl_profile(
    table: Path | None = None,
    model_name: str = "Qwen2.5-7B",
    hardware: str = "H800",
    base: EfficiencySection | None = None,
) -> PtlFit:
    """Fit the step overhead (and the profile's context) to a PTL profile."""
    frame = pd.read_csv(table or data_path("ptl_7b_h800.csv"))
    n = frame["batch_size"].to_numpy(int)
    measured = frame["decode_step_ms"].to_numpy(float)
    base = base or EfficiencySection()

    def with_params(x: np.ndarray) -> EfficiencySection:
        return base.model_copy(update={"step_overhead_s": float(x[0])})

    def residual(x: np.ndarray) -> np.ndarray:
        predicted = predict_ptl_ms(with_params(x), model_name, hardware, n, float(x[1]))
        return np.log(predicted) - np.log(measured)

    fit = least_squares(
        residual, [0.003, 1000.0], bounds=([0.0, 0.0], [0.05, 32768.0]), diff_step=1e-3
    )
    eff = with_params(fit.x)
    predicted = predict_ptl_ms(eff, model_name, hardware, n, float(fit.x[1]))
    return PtlFit(
        eff, float(fit.x[1]), tuple(map(int, n)), tuple(map(float, measured)),
        tuple(map(float, predicted)),
    )  # fmt: skip


# -- calibration of the live runtime's profile (``tandem calibrate``) --------------------

OPERATOR_TABLES: dict[str, tuple[str, dict[str, str], str, list[tuple[str, ...]]]] = {
    # operator: (csv file, basis input -> column, target column, candidate basis sets)
    "decode": (
        "decode.csv",
        {"n": "batch_size", "ctx": "context_tokens"},
        "step_s",
        [("1", "n"), ("1", "n", "ctx"), ("1", "n", "n^2"), ("1", "n", "n^2", "ctx")],
    ),
    # how much slower decode runs while the trainer computes on the same host (a factor;
    # newer profiles only)
    "decode_slowdown": (
        "decode_contended.csv",
        {"n": "batch_size"},
        "slowdown",
        [("1",), ("1", "n"), ("1", "n", "n^2")],
    ),
    # how much slower training runs while generation decodes on the same host
    "train_slowdown": (
        "train_contended.csv",
        {"tokens": "num_tokens"},
        "slowdown",
        [("1",), ("1", "tokens")],
    ),
    "prefill": (
        "prefill.csv",
        {"tokens": "num_tokens"},
        "prefill_s",
        [("1", "tokens"), ("1", "tokens", "tokens^2")],
    ),
    "forward": (
        "train.csv",
        {"tokens": "num_tokens"},
        "forward_s",
        [("1", "tokens"), ("1", "tokens", "tokens^2")],
    ),
    "backward": (
        "train.csv",
        {"tokens": "num_tokens"},
        "backward_s",
        [("1", "tokens"), ("1", "tokens", "tokens^2")],
    ),
    "optimizer": ("train.csv", {}, "optimizer_s", [("1",)]),
    "weight_transfer": (
        "weight_sync.csv",
        {"bytes": "num_bytes"},
        "transfer_s",
        [("1",), ("1", "bytes")],
    ),
    "weight_pause": (
        "weight_sync.csv",
        {"bytes": "num_bytes"},
        "pause_s",
        [("1",), ("1", "bytes")],
    ),
}


@dataclass(slots=True)
class OperatorCalibration:
    name: str
    fit: OperatorFit
    candidates: dict[str, float]  # basis set (and estimator) -> held-out MAPE
    measured_s: np.ndarray
    heldout_predicted_s: np.ndarray  # each point predicted by a fit that did not see it
    estimator: str = "least-squares"  # one of ESTIMATORS
    # each input column's least and largest measured value: a fit beyond them extrapolates
    measured_range: dict[str, tuple[float, float]] = field(default_factory=dict)


def _design(frame: pd.DataFrame, inputs: dict[str, str], bases: tuple[str, ...]) -> np.ndarray:
    rows = [{k: r[c] for k, c in inputs.items()} for _, r in frame.iterrows()]
    return np.array([[BASES[b](x) for b in bases] for x in rows], dtype=float)


# How each basis set is fitted. Timing noise on a shared CPU is one-sided (interference
# only adds time), so a few slow repeats pull a least-squares line up; the median
# (quantile) regression follows the typical time. Held-out error picks per operator.
ESTIMATORS = ("least-squares", "median")


def _fit(x: np.ndarray, y: np.ndarray, estimator: str) -> np.ndarray:
    """Non-negative coefficients of ``y ≈ x @ coefs``."""
    from sklearn.linear_model import LinearRegression, QuantileRegressor

    if estimator == "median":
        # scaled columns: the highs solver is exact, but tiny coefficients (s per token)
        # next to large inputs make the problem badly scaled
        scale = np.abs(x).max(axis=0) + 1e-30
        model = QuantileRegressor(quantile=0.5, alpha=0.0, fit_intercept=False, solver="highs")
        coefs = model.fit(x / scale, y).coef_ / scale
        if (coefs >= 0).all():
            return coefs
        # a negative coefficient is not a cost: fall back to the non-negative fit
    model = LinearRegression(fit_intercept=False, positive=True).fit(x, y)
    return model.coef_


def _heldout(x: np.ndarray, y: np.ndarray, estimator: str, seed: int = 0) -> np.ndarray:
    """Out-of-fold predictions (k-fold, k ≤ 5) of a non-negative fit."""
    from sklearn.model_selection import KFold

    out = np.empty_like(y)
    folds = KFold(n_splits=min(5, len(y)), shuffle=True, random_state=seed)
    for train, test in folds.split(x):
        out[test] = x[test] @ _fit(x[train], y[train], estimator)
    return out


def read_table(path: Path) -> pd.DataFrame:
    """A profile's CSV table; a ValueError naming ``path`` if it holds no table."""
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{path}: empty file (no header row, no measurements)") from None
    except pd.errors.ParserError as err:
        raise ValueError(f"{path}: not a CSV table ({str(err).strip()})") from None


def missing_columns(name: str, frame: pd.DataFrame) -> list[str]:
    """The columns operator ``name``'s fit needs that ``frame`` lacks."""
    _, inputs, target, _ = OPERATOR_TABLES[name]
    return sorted(({target} | set(inputs.values())) - set(frame.columns))


def _numeric_columns(frame: pd.DataFrame, columns: list[str], source: str) -> pd.DataFrame:
    """``frame`` with ``columns`` as floats; a ValueError naming the first cell that is
    empty, text or infinite (a fit on it fails with an error that names no file)."""
    out = frame.copy()
    for column in columns:
        values = pd.to_numeric(frame[column], errors="coerce").to_numpy(float)
        bad = ~np.isfinite(values)
        if bad.any():
            row = int(np.argmax(bad))
            raw = frame[column].iloc[row]
            what = "empty" if pd.isna(raw) else f"{raw!r} is not a finite number"
            raise ValueError(f"{source}: column {column}, row {row + 1}: {what}")
        out[column] = values
    return out


def calibrate_operator(
    name: str, frame: pd.DataFrame, source: str | None = None
) -> OperatorCalibration:
    """Fit operator ``name`` to ``frame``; ``source`` (the file) is named in errors."""
    _, inputs, target, candidates = OPERATOR_TABLES[name]
    source = source or f"profile for {name}"
    missing = missing_columns(name, frame)
    if missing:
        raise ValueError(f"{source}: missing column(s) {', '.join(missing)} (operator {name})")
    frame = _numeric_columns(frame, sorted({target} | set(inputs.values())), source)
    check_measurements(frame, target, sorted(set(inputs.values())), source)
    if len(frame) < 2:
        raise ValueError(
            f"{source}: operator {name} needs at least 2 positive measurements of {target}, "
            f"got {len(frame)}"
        )
    y = frame[target].to_numpy(float)
    scores, preds = {}, {}
    for bases in _separable(frame, inputs, candidates, name, source):
        x = _design(frame, inputs, bases)
        for estimator in ESTIMATORS:
            preds[bases, estimator] = _heldout(x, y, estimator)
            scores[bases, estimator] = float(np.mean(np.abs(preds[bases, estimator] - y) / y))
    # simpler on ties: fewer bases, then least squares
    best = min(scores, key=lambda k: (round(scores[k], 3), len(k[0]), ESTIMATORS.index(k[1])))
    bases, estimator = best
    coefs = _fit(_design(frame, inputs, bases), y, estimator)
    fit = OperatorFit(bases, tuple(float(c) for c in coefs), scores[best])
    named = {_candidate_name(*k): v for k, v in scores.items()}
    ranges = {c: (float(frame[c].min()), float(frame[c].max())) for c in inputs.values()}
    return OperatorCalibration(name, fit, named, y, preds[best], estimator, ranges)


def _separable(
    frame: pd.DataFrame,
    inputs: dict[str, str],
    candidates: list[tuple[str, ...]],
    name: str,
    source: str,
) -> list[tuple[str, ...]]:
    """The candidate basis sets whose terms the rows tell apart (the design has full column
    rank): one size of an input cannot split a fixed cost from a per-unit one, two cannot
    fit a quadratic. ``weight_sync.csv`` at the model's one size fits a constant; a table
    where no candidate is left is refused, naming the column."""
    distinct = frame[sorted(set(inputs.values()))].drop_duplicates()
    kept = [bases for bases in candidates if _full_rank(_design(distinct, inputs, bases))]
    if not kept:
        raise inseparable_error(frame, sorted(set(inputs.values())), name, source)
    return kept


def _full_rank(x: np.ndarray) -> bool:
    scaled = x / (np.abs(x).max(axis=0) + 1e-30)  # bytes next to a constant: scale columns
    return int(np.linalg.matrix_rank(scaled)) == x.shape[1]


def _candidate_name(bases: tuple[str, ...], estimator: str) -> str:
    return "+".join(bases) if estimator == "least-squares" else f"{'+'.join(bases)} (median)"


def skipped_operators(profile_dir: Path) -> dict[str, str]:
    """The optional operators whose table is in an older profile format (it lacks a column
    the fit needs; e.g. decode_contended.csv before its ``slowdown`` column), each with
    why it is skipped. Other operators calibrate without them."""
    skipped = {}
    for name in OPTIONAL_OPERATORS:
        path = profile_dir / OPERATOR_TABLES[name][0]
        if not path.is_file():
            continue
        missing = missing_columns(name, read_table(path))
        if missing:
            skipped[name] = (
                f"{path} is in an older profile format (no column {', '.join(missing)}); "
                "profile again to calibrate it"
            )
    return skipped


def calibrate_profile(
    profile_dir: Path, note: Callable[[str], None] | None = None
) -> dict[str, OperatorCalibration]:
    """Fit every operator of a ``tandem profile`` directory (optional ones if profiled in
    the current format: :func:`skipped_operators`); ``note`` hears of implausible tables."""
    skipped = skipped_operators(profile_dir)
    out = {}
    for name, (filename, *_rest) in OPERATOR_TABLES.items():
        path = profile_dir / filename
        if name in skipped or (not path.exists() and name in OPTIONAL_OPERATORS):
            continue
        if not path.exists():
            raise ValueError(f"profile {profile_dir}: {filename} is missing")
        out[name] = calibrate_operator(name, read_table(path), str(path))
    _check_tables(profile_dir, note or (lambda text: None))
    return out


def _check_tables(profile_dir: Path, note: Callable[[str], None]) -> None:
    """What holds across a table's rows (its rows passed :func:`calibrate_operator`)."""
    decode = profile_dir / "decode.csv"
    for text in decode_warnings(read_table(decode), str(decode)):
        note(text)
    weight_sync = profile_dir / "weight_sync.csv"
    check_weight_sync(read_table(weight_sync), str(weight_sync))


def cost_model_document(fits: dict[str, OperatorCalibration], profile: dict) -> dict:
    return {
        "format": COST_MODEL_FORMAT,
        "version": COST_MODEL_VERSION,
        "weight_bytes": profile["weight_bytes"],
        "kv_capacity_tokens": profile["kv_capacity_tokens"],
        "source": profile,
        "operators": {name: c.fit.to_dict() for name, c in fits.items()},
        "candidates": {name: c.candidates for name, c in fits.items()},
        "measured_range": {
            name: {col: list(span) for col, span in c.measured_range.items()}
            for name, c in fits.items()
        },
    }
