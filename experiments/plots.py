"""Plots of run results (matplotlib is imported only under experiments/)."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

from policies.resources import TRAINER, instance_of, is_generation

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from policies.results import RunResult, write_atomic  # noqa: E402
from policies.trace import cpu_roles  # noqa: E402

KIND_COLORS = {
    "prefill": "#f5a623",
    "decode": "#4a90d9",
    "train": "#7ed321",
    "weight_sync": "#d0021b",
    "context_switch": "#9013fe",
    "idle": "#eeeeee",
}


def _resource_order(names: list[str]) -> list[str]:
    def key(name: str) -> tuple[int, int, str]:
        if name == TRAINER:
            return (0, 0, name)
        if is_generation(name):
            return (1, instance_of(name), name)
        return (2, 0, name)

    return sorted(set(names), key=key)


def save_figure(fig: plt.Figure, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    write_atomic(path, buf.getvalue())


ROLE_COLORS = {  # runtime.host_cpu's roles
    "engine": "#4a90d9",
    "frontend": "#9bc2ea",
    "trainer": "#7ed321",
    "actor": "#f5a623",
    "other": "#999999",
}


def timeline(result: RunResult, path: Path, max_resources: int = 48) -> Path:
    """Gantt chart of every resource: bubbles are the white gaps and grey idle spans; a live
    run's CPU timeline below it (the cores each role used)."""
    spans = result.spans_frame()
    names, shown = shown_resources(_resource_order(list(spans["resource"])), max_resources)
    height = 1.5 + 0.28 * len(names)
    if result.cpu_timeline:
        fig, (ax, cpu_ax) = plt.subplots(
            2, 1, figsize=(12, height + 2.0), sharex=True, height_ratios=[height, 2.0]
        )
    else:
        fig, ax = plt.subplots(figsize=(12, height))
    for row, name in enumerate(names):
        own = spans[spans["resource"] == name]
        for kind, group in own.groupby("kind"):
            bars = list(zip(group["start_s"], group["end_s"] - group["start_s"]))
            ax.broken_barh(bars, (row - 0.4, 0.8), color=KIND_COLORS.get(str(kind), "#999"))
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.invert_yaxis()
    title = f"{result.spec.run.name}: {result.spec.pipeline.mode}"
    rate = f"{result.metrics['throughput_samples_per_s']:.3g} samples/s"
    ax.set_title(f"{title} — {rate}" + (f"\n{shown}" if shown else ""))
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in KIND_COLORS.values()]
    ax.legend(handles, KIND_COLORS.keys(), loc="upper right", fontsize=7, ncol=6)
    if result.cpu_timeline:
        cpu_panel(cpu_ax, result.cpu_frame())
        cpu_ax.set_xlabel("time since run start (s)")
    else:
        ax.set_xlabel("time since run start (s)")
    save_figure(fig, path)
    return path


def shown_resources(names: list[str], max_resources: int) -> tuple[list[str], str]:
    """The rows a timeline draws: every resource but generation instances beyond
    ``max_resources``, which are thinned to ``max_resources`` spread evenly over them (the
    first instances alone would show only one dispatch group: ``skewness-aware`` puts the
    long tail first); and a note saying so (empty when every instance is drawn)."""
    gens = [n for n in names if is_generation(n)]
    if len(gens) <= max_resources:
        return names, ""
    picks = np.unique(np.linspace(0, len(gens) - 1, max_resources).round().astype(int))
    keep = {gens[i] for i in picks}
    rows = [n for n in names if not is_generation(n) or n in keep]
    return rows, f"{len(picks)} of {len(gens)} generation instances shown, evenly spaced"


def cpu_panel(ax: plt.Axes, cpu: pd.DataFrame) -> None:
    """The cores each role used, stacked, interval by interval (``cpu_timeline.csv``)."""
    present = cpu_roles(cpu.columns)
    roles = [r for r in ROLE_COLORS if r in present] + [r for r in present if r not in ROLE_COLORS]
    edges = [*cpu["start_s"], cpu["end_s"].iloc[-1]]
    bottom = pd.Series(0.0, index=cpu.index)
    for role in roles:
        top = bottom + cpu[role]
        ax.stairs(top, edges, baseline=bottom, fill=True, color=ROLE_COLORS.get(role, "#ccc"),
                  label=role)  # fmt: skip
        bottom = top
    ax.set_ylabel("cores used", fontsize=8)
    ax.set_ylim(0, max(1.0, float(cpu["total"].max())) * 1.35)  # room for the legend
    ax.legend(loc="upper right", fontsize=7, ncol=len(roles))


def sweep_summary(
    frame: pd.DataFrame, keys: list[str], path: Path, metric: str = "throughput_samples_per_s"
) -> Path:
    """The metric against the first grid key, one series per combination of the others."""
    save_figure(sweep_figure(frame, keys, metric), path)
    return path


def sweep_figure(frame: pd.DataFrame, keys: list[str], metric: str) -> plt.Figure:
    """A numeric first key: lines over its sorted values. A categorical one (modes,
    policies): grouped bars in the grid's order, nothing joining them, labels slanted."""
    ok = frame[frame["error"].isna()] if "error" in frame else frame
    fig, ax = plt.subplots(figsize=(8, 4.5))
    x, rest = keys[0], keys[1:]
    groups = list(ok.groupby(rest, sort=False)) if rest else [((), ok)]
    series = [(_series_name(rest, label) or metric, group) for label, group in groups]
    if _is_numeric(ok[x]):
        for name, group in series:
            group = group.sort_values(x)
            ax.plot(group[x].astype(str), group[metric], marker="o", label=name)
    else:
        _grouped_bars(ax, series, x, metric)
    ax.set_xlabel(x)
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_title(f"sweep: {metric}")
    if rest:  # beside the axes, never over the bars or lines
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        fig.tight_layout()
    return fig


def _series_name(keys: list[str], label: object) -> str:
    values = label if isinstance(label, tuple) else (label,)
    return ", ".join(f"{k}={v}" for k, v in zip(keys, values))


def _is_numeric(column: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)


def _grouped_bars(
    ax: plt.Axes, series: list[tuple[str, pd.DataFrame]], x: str, metric: str
) -> None:
    """One bar per (category, series), categories in the order the grid gave them."""
    categories = list(dict.fromkeys(v for _, g in series for v in g[x].astype(str)))
    width = 0.8 / len(series)
    for k, (name, group) in enumerate(series):
        at = [categories.index(v) - 0.4 + width * (k + 0.5) for v in group[x].astype(str)]
        ax.bar(at, group[metric], width=width, label=name)
    ax.set_xticks(range(len(categories)), categories, rotation=30, ha="right", fontsize=8)
