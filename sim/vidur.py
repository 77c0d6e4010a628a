"""GEMM efficiencies of the roofline, fitted to public measured GPU operator profiles.

Vidur (Agrawal et al., MLSys 2024) publishes per-operator CUDA timings of vLLM-style
transformer layers: ``data/profiling/compute/<gpu>/<org>/<model>/mlp.csv``, one row per
(token count, tensor-parallel degree) with the median time (ms) of each linear layer —
``attn_pre_proj`` (QKV), ``attn_post_proj`` (O), ``mlp_up_proj`` (gate and up),
``mlp_down_proj`` — and the layer's shape (``n_head``, ``n_kv_head``, ``n_embd``,
``n_expanded_embd``, ``use_gated_mlp``). :func:`load_vidur_gemms` reads every such file
below a directory; :func:`fit_gemm_efficiency` fits the three GEMM terms of
``policies.sim_section.EfficiencySection`` (compute and memory efficiency, and the exponent of
their smooth maximum) with a fixed latency per kernel, by least squares on log time,
i.e. on relative error. In the engine's step model the kernels' latencies are part of
``step_overhead_s``, fitted with the whole step (``sim.calibration.fit_ptl_profile``).

Held-out error is reported per operator two ways: on GPUs the fit did not see (the point
of a hardware-independent model: fit on H100, predict A100) and on a random fifth of
the fitting GPU's rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from sim.tables import hardware

# Vidur's GPU folders, as rows of hardware.csv
VIDUR_GPUS = {"a100": "A100-SXM-80GB", "h100": "H100-SXM"}
GEMM_OPERATORS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
FORMS = ("smooth-max", "sum", "max")  # how a GEMM's compute and memory time combine


@dataclass(slots=True, frozen=True)
class GemmFit:
    form: str
    gemm_compute: float
    gemm_memory: float
    gemm_overlap: float  # p of the smooth maximum (1 for "sum", inf for "max")
    kernel_latency_s: float  # fixed time of one GEMM kernel (in the step model: overhead)
    fitted_on: tuple[str, ...]

    def predict_s(self, frame: pd.DataFrame) -> np.ndarray:
        x = (self.gemm_compute, self.gemm_memory, self.gemm_overlap)
        return _predict(x, frame, self.form) + self.kernel_latency_s


def gemm_params(frame: pd.DataFrame, operator: str) -> pd.Series:
    """Weights of one linear layer (per tensor-parallel worker)."""
    h, f = frame["n_embd"], frame["n_expanded_embd"]
    head_dim = h / frame["n_head"]
    tp = frame["num_tensor_parallel_workers"]
    gated = frame["use_gated_mlp"].astype(str).str.lower().eq("true").astype(float)
    if operator == "attn_pre_proj":
        return h * head_dim * (frame["n_head"] + 2 * frame["n_kv_head"]) / tp
    if operator == "attn_post_proj":
        return h * h / tp
    if operator == "mlp_up_proj":
        return h * f * (1 + gated) / tp
    return f * h / tp


def load_vidur_gemms(root: Path) -> pd.DataFrame:
    """Every GEMM timing under ``root``: columns gpu, model, operator, tp, tokens, params,
    time_s, flops (peak, per GPU) and bytes_per_s (peak)."""
    frames = []
    for path in sorted(Path(root).rglob("mlp.csv")):
        gpu = next((p for p in path.parts if p in VIDUR_GPUS), None)
        if gpu is None or path.stat().st_size == 0:
            continue
        raw = pd.read_csv(path)
        hw = hardware(VIDUR_GPUS[gpu])
        model = "/".join(path.parts[-3:-1])
        for op in GEMM_OPERATORS:
            frames.append(
                pd.DataFrame(
                    {
                        "gpu": gpu, "model": model, "operator": op,
                        "tp": raw["num_tensor_parallel_workers"], "tokens": raw["num_tokens"],
                        "params": gemm_params(raw, op),
                        "time_s": raw[f"time_stats.{op}.median"] * 1e-3,
                        "flops": hw.bf16_flops, "bytes_per_s": hw.hbm_bytes_per_s,
                    }
                )
            )  # fmt: skip
    if not frames:
        raise ValueError(f"{root}: no Vidur mlp.csv of a known GPU ({', '.join(VIDUR_GPUS)})")
    return pd.concat(frames, ignore_index=True)


def _predict(x: tuple[float, float, float], frame: pd.DataFrame, form: str) -> np.ndarray:
    compute_eff, memory_eff, p = x
    compute = 2 * frame["params"] * frame["tokens"] / (frame["flops"] * compute_eff)
    memory = 2 * frame["params"] / (frame["bytes_per_s"] * memory_eff)  # bf16 weights
    c, m = compute.to_numpy(float), memory.to_numpy(float)
    if form == "max":
        return np.maximum(c, m)
    if form == "sum":
        return c + m
    return (c**p + m**p) ** (1 / p)


def fit_gemm_efficiency(frame: pd.DataFrame, form: str = "smooth-max") -> GemmFit:
    y = np.log(frame["time_s"].to_numpy(float))
    fixed_p = {"sum": 1.0, "max": float("inf")}.get(form)

    def residual(x: np.ndarray) -> np.ndarray:
        p = fixed_p if fixed_p is not None else x[3]
        return np.log(_predict((x[0], x[1], p), frame, form) + x[2]) - y

    # compute efficiency, memory efficiency, kernel latency (s), [p]
    x0, lo, hi = [0.7, 0.8, 5e-6], [0.05, 0.05, 0.0], [1.0, 1.0, 1e-4]
    if fixed_p is None:
        x0, lo, hi = x0 + [2.0], lo + [1.0], hi + [20.0]
    fit = least_squares(residual, x0, bounds=(lo, hi))
    p = fixed_p if fixed_p is not None else float(fit.x[3])
    gpus = tuple(sorted(frame["gpu"].unique()))
    return GemmFit(form, float(fit.x[0]), float(fit.x[1]), p, float(fit.x[2]), gpus)


def relative_errors(fit: GemmFit, frame: pd.DataFrame) -> pd.Series:
    return pd.Series(
        np.abs(fit.predict_s(frame) / frame["time_s"].to_numpy(float) - 1), frame.index
    )


def error_table(fit: GemmFit, frame: pd.DataFrame) -> pd.DataFrame:
    """Median and 90th-percentile relative error per GPU and operator."""
    errors = frame.assign(error=relative_errors(fit, frame))
    table = errors.groupby(["gpu", "operator"])["error"].agg(
        median="median", p90=lambda e: float(np.percentile(e, 90)), rows="size"
    )
    return table.reset_index()


def heldout_report(frame: pd.DataFrame, fit_gpu: str, seed: int = 0) -> pd.DataFrame:
    """Every form fitted on ``fit_gpu`` (a random 80 % of its rows), errors on the other
    GPUs (``held-out GPU``) and on the fitting GPU's remaining fifth (``held-out rows``)."""
    own = frame[frame["gpu"] == fit_gpu]
    rng = np.random.default_rng(seed)
    test_rows = rng.random(len(own)) < 0.2
    rows = []
    for form in FORMS:
        fit = fit_gemm_efficiency(own[~test_rows], form)
        for kind, part in (
            ("held-out rows", own[test_rows]),
            ("held-out GPU", frame[frame["gpu"] != fit_gpu]),
        ):
            if part.empty:
                continue
            table = error_table(fit, part).assign(form=form, split=kind, fitted_on=fit_gpu)
            rows.append(table)
    return pd.concat(rows, ignore_index=True)


EFFICIENCY_FILE = "efficiency.json"  # in a ``tandem calibrate --from vidur`` directory


@dataclass(slots=True, frozen=True)
class VidurCalibration:
    fit: GemmFit  # the smooth maximum, fitted on every GPU found: what the roofline uses
    heldout: pd.DataFrame  # every form fitted on one GPU, errors elsewhere (heldout_report)

    def efficiency(self) -> dict[str, object]:
        """The GEMM terms of ``sim.efficiency``, with where they came from."""
        return {
            "gemm_compute": self.fit.gemm_compute,
            "gemm_memory": self.fit.gemm_memory,
            "gemm_overlap": self.fit.gemm_overlap,
            "source": f"Vidur GEMM profiles of {', '.join(self.fit.fitted_on)}",
            "kernel_latency_s": self.fit.kernel_latency_s,
        }


def calibrate_vidur(root: Path) -> VidurCalibration:
    frame = load_vidur_gemms(root)
    gpus = sorted(frame["gpu"].unique())
    heldout = pd.concat([heldout_report(frame, gpu) for gpu in gpus], ignore_index=True)
    return VidurCalibration(fit_gemm_efficiency(frame), heldout)


def load_efficiency(path: Path) -> dict[str, float]:
    """The GEMM efficiencies a ``tandem calibrate --from vidur`` directory holds."""
    path = Path(path)
    if path.is_dir():
        path = path / EFFICIENCY_FILE
    if not path.exists():
        raise ValueError(
            f"sim.cost_model: {path} does not exist (run tandem calibrate --from vidur)"
        )
    try:
        data = json.loads(path.read_text())
        return {k: float(data[k]) for k in ("gemm_compute", "gemm_memory", "gemm_overlap")}
    except (ValueError, KeyError, TypeError) as err:  # JSONDecodeError is a ValueError
        raise ValueError(
            f"sim.cost_model: {path}: not GEMM efficiencies of tandem calibrate --from vidur "
            f"({type(err).__name__}: {err})"
        ) from None
