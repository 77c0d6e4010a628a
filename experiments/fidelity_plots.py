"""``tandem fidelity``'s plots: live and sim side by side, lags, one iteration's timelines."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments.fidelity_compare import METRICS, Case, pooled_lag_counts
from policies.resources import TRAINER, generation_resource
from policies.results import RunResult


def bars(frame: pd.DataFrame, path: Path) -> None:
    """One panel per metric: live and sim side by side for every case."""
    import matplotlib.pyplot as plt
    import numpy as np

    from experiments.plots import save_figure

    fig, axes = plt.subplots(1, len(METRICS), figsize=(3.2 * len(METRICS), 3.6))
    for ax, (key, label) in zip(axes, METRICS.items()):
        rows = frame[frame["metric"] == key]
        x = np.arange(len(rows))
        ax.bar(x - 0.2, rows["live"].astype(float), 0.4, label="live")
        ax.bar(x + 0.2, rows["sim"].astype(float), 0.4, label="sim")
        ax.set_xticks(x, [f"{m}\n{d}" for m, d in zip(rows["mode"], rows["dispatch"])],
                      rotation=90, fontsize=7)  # fmt: skip
        ax.set_title(label, fontsize=9)
    axes[0].legend()
    save_figure(fig, path)


def lag_histograms(cases: list[Case], path: Path) -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    from experiments.plots import save_figure

    fig, axes = plt.subplots(1, len(cases), figsize=(2.6 * len(cases), 2.8), squeeze=False)
    for ax, c in zip(axes[0], cases):
        live, sim = pooled_lag_counts(c.lives), pooled_lag_counts(c.sims)
        keys = np.array(sorted(set(live) | set(sim)))
        n_live, n_sim = sum(live.values()) or 1, sum(sim.values()) or 1
        ax.bar(keys - 0.2, [live.get(k, 0) / n_live for k in keys], 0.4, label="live")
        ax.bar(keys + 0.2, [sim.get(k, 0) / n_sim for k in keys], 0.4, label="sim")
        ax.set_xticks(keys)
        ax.set_title(c.name, fontsize=8)
        ax.set_xlabel("lag (versions)")
    axes[0][0].set_ylabel("share of trained samples")
    axes[0][0].legend(fontsize=7)
    save_figure(fig, path)


def iteration_window(result: RunResult, iteration: int) -> tuple[float, float]:
    """From the iteration's first dispatch to the end of its optimizer step."""
    samples = result.samples_frame()
    start = float(samples.loc[samples["iteration"] == iteration, "dispatch_s"].min())
    ends = [s["end_s"] for s in result.steps if s["step"] == iteration]
    end = float(ends[0]) if ends else float(samples["gen_end_s"].max())
    return start, end


def overlay_iteration_of(case: Case, wanted: int) -> int | None:
    """``wanted`` if both the case's live run and its twin ran it, else the last iteration
    both ran (a run of 2 iterations has no iteration 2); None if they share none."""
    ran = set(case.live.samples_frame()["iteration"]) & set(case.sim.samples_frame()["iteration"])
    if wanted in ran:
        return wanted
    return int(max(ran)) if ran else None


def timeline_overlay(case: Case, iteration: int, path: Path, wanted: int | None = None) -> None:
    """The spans of one iteration, live above sim, each from its iteration's start; the
    title says when that is not the ``wanted`` one (the run did not have it)."""
    import matplotlib.pyplot as plt

    from experiments.plots import KIND_COLORS, save_figure

    fig, ax = plt.subplots(figsize=(10, 3.2))
    labels = []
    for offset, (who, result) in enumerate([("sim", case.sim), ("live", case.live)]):
        start, end = iteration_window(result, iteration)
        spans = result.spans_frame()
        spans = spans[(spans["end_s"] > start) & (spans["start_s"] < end)]
        for r, resource in enumerate([TRAINER, generation_resource(0)]):
            y = 2 * offset + r
            labels.append(f"{who} {resource}")
            for _, s in spans[spans["resource"] == resource].iterrows():
                lo, hi = max(s["start_s"], start) - start, min(s["end_s"], end) - start
                ax.barh(y, hi - lo, left=lo, color=KIND_COLORS.get(s["kind"], "grey"),
                        edgecolor="black", linewidth=0.3)  # fmt: skip
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel(f"seconds from the start of iteration {iteration}")
    instead = f" (the run has no iteration {wanted})" if wanted not in (None, iteration) else ""
    ax.set_title(f"{case.name}: iteration {iteration}, live vs sim{instead}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in KIND_COLORS.values()]
    ax.legend(handles, list(KIND_COLORS), fontsize=7, loc="upper right", ncol=3)
    save_figure(fig, path)
