"""Figure helpers for the reproduction reports: grouped bars and lines, one panel per value.

Every figure is drawn from the same frame that is written as its CSV; axes carry units.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from experiments.plots import save_figure  # noqa: E402


@dataclass(frozen=True, slots=True)
class Axes:
    """Which columns go where, and the labels (with units) to print."""

    x: str  # column on the x axis (categories for bars)
    y: str  # column of values
    hue: str  # one bar / line per value of this column
    xlabel: str
    ylabel: str
    panel: str | None = None  # one subplot per value of this column


def _panels(frame: pd.DataFrame, axes: Axes) -> list[tuple[str, pd.DataFrame]]:
    if axes.panel is None:
        return [("", frame)]
    return [(str(k), g) for k, g in frame.groupby(axes.panel, sort=False)]


def _grid(num: int, width: float = 5.0) -> tuple[plt.Figure, np.ndarray]:
    fig, grid = plt.subplots(1, num, figsize=(width * num, 4.2), squeeze=False)
    return fig, grid[0]


def bars(frame: pd.DataFrame, axes: Axes, title: str, path: Path, log_y: bool = False) -> Path:
    """Grouped bars: x categories, one bar per hue value, one panel per panel value."""
    panels = _panels(frame, axes)
    fig, grid = _grid(len(panels))
    hues = list(dict.fromkeys(frame[axes.hue]))
    for ax, (name, part) in zip(grid, panels):
        xs = list(dict.fromkeys(part[axes.x]))
        width = 0.8 / len(hues)
        for j, hue in enumerate(hues):
            sel = part[part[axes.hue] == hue].set_index(axes.x)
            ys = [float(sel[axes.y].get(x, np.nan)) for x in xs]
            ax.bar(np.arange(len(xs)) + (j - (len(hues) - 1) / 2) * width, ys, width, label=hue)
        ax.set_xticks(range(len(xs)), [str(x) for x in xs])
        _label(ax, axes, name, log_y)
    grid[-1].legend(fontsize=7, loc="best")
    fig.suptitle(title)
    save_figure(fig, path)
    return path


def lines(
    frame: pd.DataFrame,
    axes: Axes,
    title: str,
    path: Path,
    log_x: bool = False,
    styles: dict[str, str] | None = None,
) -> Path:
    """One line per hue value (marker ``o``, or the style given), one panel per panel value."""
    panels = _panels(frame, axes)
    fig, grid = _grid(len(panels))
    for ax, (name, part) in zip(grid, panels):
        for hue, group in part.groupby(axes.hue, sort=False):
            group = group.sort_values(axes.x)
            style = (styles or {}).get(str(hue), "o-")
            ax.plot(group[axes.x], group[axes.y], style, label=str(hue))
        if log_x:
            ax.set_xscale("log", base=2)
        _label(ax, axes, name, False)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(title)
    save_figure(fig, path)
    return path


def _label(ax: plt.Axes, axes: Axes, panel: str, log_y: bool) -> None:
    ax.set_xlabel(axes.xlabel)
    ax.set_ylabel(axes.ylabel)
    if panel:
        ax.set_title(f"{axes.panel} = {panel}", fontsize=10)
    if log_y:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)


def twin_lines(
    frame: pd.DataFrame,
    x: str,
    left: Sequence[tuple[str, str]],
    right: tuple[str, str],
    labels: tuple[str, str, str],
    title: str,
    path: Path,
) -> Path:
    """Lines of ``left`` columns (column, legend) on one axis, ``right`` as steps on a twin."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for column, legend in left:
        ax.plot(frame[x], frame[column], "o-", label=legend)
    ax.axhline(0.0, color="grey", lw=0.8)
    twin = ax.twinx()
    twin.step(frame[x], frame[right[0]], where="mid", color="black", ls="--", label=right[1])
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    twin.set_ylabel(labels[2])
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    fig.suptitle(title)
    save_figure(fig, path)
    return path
