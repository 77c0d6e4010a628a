"""A sweep's summary.png: a categorical first key as bars in the grid's order with
readable labels, nothing joining the categories; a numeric one as lines."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from experiments import plots

METRIC = "throughput_samples_per_s"


@pytest.fixture
def drawn(monkeypatch):
    """The figures ``sweep_summary`` would save, kept instead of written."""
    figures: list[plt.Figure] = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig))
    yield figures
    for fig in figures:
        plt.close(fig)


def _frame(xs: list, dispatches: list[str]) -> pd.DataFrame:
    rows = [
        {"pipeline.mode": x, "policies.dispatch": d, METRIC: 1.0 + i, "error": None}
        for i, (x, d) in enumerate((x, d) for x in xs for d in dispatches)
    ]
    return pd.DataFrame(rows)


def test_a_categorical_axis_is_bars_in_grid_order_with_slanted_labels(drawn):
    modes = ["stream-async", "colocated-sync", "conventional"]
    frame = _frame(modes, ["random", "least-loaded"])
    plots.sweep_summary(frame, ["pipeline.mode", "policies.dispatch"], Path("summary.png"))
    ax = drawn[0].axes[0]
    assert not [line for line in ax.get_lines() if len(line.get_xdata()) > 1]  # no joining
    assert len(ax.patches) == 6  # a bar per (mode, dispatch)
    labels = ax.get_xticklabels()
    assert [t.get_text() for t in labels] == modes  # as the grid gave them, not sorted
    assert all(t.get_rotation() > 0 for t in labels)


def test_a_numeric_axis_keeps_its_lines(drawn):
    frame = pd.DataFrame({"run.seed": [3, 1, 2], METRIC: [1.0, 2.0, 3.0], "error": None})
    plots.sweep_summary(frame, ["run.seed"], Path("summary.png"))
    (line,) = drawn[0].axes[0].get_lines()
    assert list(line.get_xdata()) == ["1", "2", "3"]


def test_the_legend_lies_beside_the_axes_never_over_the_bars(drawn):
    """Seen: with a second grid key, the legend covered the bars of summary.png."""
    frame = _frame(["stream-async", "pipeline"], ["random", "least-loaded", "skewness-aware"])
    plots.sweep_summary(frame, ["pipeline.mode", "policies.dispatch"], Path("summary.png"))
    fig = drawn[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    legend, box = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
    assert legend.x0 >= box.x1  # wholly to the right of the plotting area
