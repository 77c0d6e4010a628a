"""``tandem calibrate PROFILE_DIR --out DIR``: fit the simulator's cost model to a profile.

Writes ``DIR/cost_model.json`` (load it with ``sim.cost_model: profiled:DIR``),
``DIR/errors.json`` (held-out mean absolute percentage error per operator and candidate)
and one parity plot per operator (``DIR/parity-<operator>.png``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import matplotlib.pyplot as plt

from experiments.plots import save_figure
from policies.results import write_atomic
from sim.calibration import (
    OperatorCalibration,
    calibrate_profile,
    cost_model_document,
    skipped_operators,
)
from sim.profile_checks import check_profile_info
from sim.tables import Hardware

log = logging.getLogger(__name__)


def parity_plot(c: OperatorCalibration, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ms = c.measured_s * 1e3
    ps = c.heldout_predicted_s * 1e3
    ax.scatter(ms, ps, s=14)
    lo, hi = min(ms.min(), ps.min()), max(ms.max(), ps.max())
    ax.plot([lo, hi], [lo, hi], color="grey", linewidth=1)
    ax.set_xlabel("measured (ms)")
    ax.set_ylabel("predicted, held out (ms)")
    ax.set_title(f"{c.name}: {'+'.join(c.fit.bases)}, MAPE {c.fit.heldout_mape:.1%}")
    save_figure(fig, path)


def load_profile_info(profile_dir: Path, hardware: Mapping[str, Hardware] | None = None) -> dict:
    """``profile_dir``'s profile.json, checked (a ValueError naming the file); its hardware
    must be ``cpu`` or in ``hardware`` (default: hardware.csv)."""
    path = profile_dir / "profile.json"
    if not profile_dir.is_dir():
        raise ValueError(f"{profile_dir}: no such directory (give a `tandem profile` directory)")
    if not path.is_file():
        raise ValueError(
            f"{profile_dir}: no profile.json (give a `tandem profile` directory, or Vidur's "
            "data with --from vidur)"
        )
    try:
        profile = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    check_profile_info(profile, path, hardware)
    return profile


def calibrate(
    profile_dir: Path,
    out: Path,
    note: Callable[[str], None] | None = None,
    hardware: Mapping[str, Hardware] | None = None,
) -> dict[str, OperatorCalibration]:
    """Fit ``profile_dir`` and write the cost model, its errors and parity plots to ``out``;
    ``note`` hears of each operator skipped, and why (default: the log); ``hardware``: the
    GPUs the profile may name (a spec's ``sim.tables.hardware_of``; default hardware.csv)."""
    note = note or log.warning
    profile = load_profile_info(profile_dir, hardware)
    for name, why in skipped_operators(profile_dir).items():
        note(f"{name} not calibrated: {why}")
    fits = calibrate_profile(profile_dir, note)
    out.mkdir(parents=True, exist_ok=True)
    document = cost_model_document(fits, profile)
    write_atomic(out / "cost_model.json", json.dumps(document, indent=2).encode())
    errors = {
        name: {
            "chosen": "+".join(c.fit.bases),
            "estimator": c.estimator,
            "heldout_mape": c.fit.heldout_mape,
            "candidates": c.candidates,
        }
        for name, c in fits.items()
    }
    write_atomic(out / "errors.json", json.dumps(errors, indent=2).encode())
    for name, c in fits.items():
        parity_plot(c, out / f"parity-{name}.png")
    _remove_stale_plots(out, fits)
    return fits


def _remove_stale_plots(out: Path, fits: dict[str, OperatorCalibration]) -> None:
    """A parity plot of an operator this fit does not have is an earlier fit's: it would
    sit beside this cost model as if it described it."""
    for path in out.glob("parity-*.png"):
        if path.stem.removeprefix("parity-") not in fits:
            path.unlink()


def calibrate_from_vidur(root: Path, out: Path) -> str:
    """Fit the roofline's GEMM efficiencies to Vidur's profiles under ``root``; write
    ``efficiency.json`` (load it with ``sim.cost_model: roofline:OUT``), ``heldout.csv``
    (median / 90th-percentile relative error per operator, form, fitting GPU and held-out
    GPU or rows) and ``report.md``. Returns the report's text."""
    from sim.vidur import EFFICIENCY_FILE, calibrate_vidur

    cal = calibrate_vidur(root)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / EFFICIENCY_FILE, json.dumps(cal.efficiency(), indent=2).encode())
    write_atomic(out / "heldout.csv", cal.heldout.to_csv(index=False).encode())
    text = vidur_report(cal)
    write_atomic(out / "report.md", text.encode())
    return text


def vidur_report(cal) -> str:  # cal: sim.vidur.VidurCalibration
    e = cal.efficiency()
    lines = [
        "# GEMM efficiencies from Vidur's profiles",
        "",
        f"Fitted on {e['source']}: compute {e['gemm_compute']:.4f} of peak FLOP/s, weight "
        f"streaming {e['gemm_memory']:.4f} of peak HBM bandwidth, smooth-max exponent "
        f"{e['gemm_overlap']:.3f}, kernel latency {e['kernel_latency_s'] * 1e6:.1f} µs.",
        "",
        "Held-out relative error per operator (median / p90), by form:",
        "",
        "| form | fitted on | split | GPU | operator | median | p90 |",
        "|---|---|---|---|---|---:|---:|",
    ]
    for r in cal.heldout.itertuples():
        lines.append(
            f"| {r.form} | {r.fitted_on} | {r.split} | {r.gpu} | {r.operator} | "
            f"{r.median:.1%} | {r.p90:.1%} |"
        )
    return "\n".join(lines) + "\n"
