"""How well a run's ranker ranked the run's own samples, for run.log and metrics.json.

Measured on the finished samples that went out with a prediction, iteration by
iteration (dispatch ranks the samples of one batch against each other), then averaged
over the iterations: ``ranker_spearman``, ``ranker_recall_20`` / ``_10`` / ``_5``
(tie-aware recall of the longest 20 / 10 / 5 %, :mod:`ranker.evaluate`). Also
``ranker_predicted_share`` (a live ranker predicts nothing until its first refit lands),
``ranker_recurring_share`` (predicted samples whose prompt an earlier iteration had: only
those can the ranker's history know)
and ``ranker_source``: how the ranker was obtained, in words (a file, or the fit).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from policies.results import RunResult, write_atomic
from ranker.evaluate import rank_metrics

log = logging.getLogger(__name__)

QUALITY_FIELDS = ("spearman", "recall_20", "recall_10", "recall_5")
RANKER_METRICS = (
    "ranker_source",
    *(f"ranker_{f}" for f in QUALITY_FIELDS),
    "ranker_predicted_share",
    "ranker_recurring_share",
    "ranker_num_iterations",
)


def rank_quality(samples: pd.DataFrame) -> dict[str, float | int | None]:
    """Per-iteration rank metrics of the predicted samples, averaged (None: nothing to rank)."""
    done = samples[samples["gen_end_s"].notna()]
    predicted = done[done["predicted_output_tokens"].notna()]
    per_iteration = [
        rank_metrics(
            g["output_tokens"].to_numpy(float), g["predicted_output_tokens"].to_numpy(float)
        )
        for _, g in predicted.groupby("iteration")
        if len(g) >= 2
    ]
    out: dict[str, float | int | None] = {}
    for field in QUALITY_FIELDS:
        values = [getattr(m, field) for m in per_iteration if not math.isnan(getattr(m, field))]
        out[f"ranker_{field}"] = float(np.mean(values)) if values else None
    out["ranker_predicted_share"] = len(predicted) / len(done) if len(done) else None
    out["ranker_recurring_share"] = _recurring_share(predicted, samples)
    out["ranker_num_iterations"] = len(per_iteration)
    return out


def _recurring_share(predicted: pd.DataFrame, samples: pd.DataFrame) -> float | None:
    """Of the predicted samples, the share whose prompt a sample of an earlier iteration
    had: the ranker's history (its strongest signal) can know only those prompts."""
    if predicted.empty:
        return None
    first = samples.groupby("prompt_id")["iteration"].min()
    return float((predicted["iteration"] > predicted["prompt_id"].map(first)).mean())


def record_ranker_quality(result: RunResult, source: str, metrics_dir: Path | None = None) -> None:
    """Add the ranker's source and quality to ``result.metrics`` and log them;
    ``metrics_dir``: rewrite its metrics.json too (a live run saved it already)."""
    quality = rank_quality(result.samples_frame())
    result.metrics.update({"ranker_source": source, **quality})
    log.info("ranker: %s", source)
    log.info("ranker quality on the run's own samples: %s", describe(quality))
    if metrics_dir is not None:
        text = json.dumps(result.metrics, indent=2).encode()
        write_atomic(Path(metrics_dir) / "metrics.json", text)


def describe(quality: dict[str, Any]) -> str:
    if quality["ranker_num_iterations"] == 0:
        return "no iteration with two predicted samples: nothing to measure"
    share = quality["ranker_predicted_share"]
    recalls = " / ".join(_fmt(quality[f"ranker_recall_{k}"]) for k in (20, 10, 5))
    return (
        f"Spearman {_fmt(quality['ranker_spearman'])}, recall of the longest 20 / 10 / 5 % "
        f"{recalls} (means over {quality['ranker_num_iterations']} iterations; "
        f"{share:.0%} of the samples predicted)"
    )


def brief(quality: dict[str, Any]) -> str:
    """``describe`` in one short line, for ``tandem run``'s summary."""
    if quality["ranker_num_iterations"] == 0:
        return "ranker: nothing to measure (no iteration with two predicted samples)"
    line = (
        f"ranker: Spearman {_fmt(quality['ranker_spearman'])}, recall of the longest 20 % "
        f"{_fmt(quality['ranker_recall_20'])} (more in run.log)"
    )
    recurring = quality.get("ranker_recurring_share")
    if recurring is not None and recurring < 0.5:
        line += (
            f"; only {recurring:.0%} of its prompts had come up in an earlier iteration, "
            "so it ranked mostly without their history (its strongest signal)"
        )
    return line


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
