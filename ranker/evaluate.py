"""How well a ranker orders output lengths, against a prompt-length-only baseline.

Metrics, each over one set of samples:

* ``recall_20`` / ``recall_10`` / ``recall_5`` — of the top ``k`` samples by predicted
  length (``k`` = 20 %, 10 %, 5 % of the set), the share whose true length is at least
  the true ``k``-th longest (tie-aware, so capped lengths all count as top);
* ``spearman``, ``kendall`` — rank correlations (``scipy.stats``; Kendall's tau-b).

Two held-out settings: a **later epoch** (fit on the iterations before a cut, score the
iterations from the cut on, history of the test iterations available strictly before
each one, as online) and **held-out prompts** (fit without 20 % of the prompt ids, score
those prompts with no history at all: text and prompt length only).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import ConstantInputWarning, kendalltau, spearmanr

from ranker.features import FeatureSpec
from ranker.online import RankerPredictor

TOP_FRACTIONS = (0.2, 0.1, 0.05)
TIMING_ROWS = 10_000


@dataclass(slots=True, frozen=True)
class RankMetrics:
    recall_20: float
    recall_10: float
    recall_5: float
    spearman: float
    kendall: float
    num_samples: int


def top_recall(true_tokens: np.ndarray, scores: np.ndarray, fraction: float) -> float:
    """Tie-aware recall of the true longest ``fraction`` among the top ``fraction`` by score."""
    k = max(1, int(round(fraction * len(true_tokens))))
    threshold = np.sort(true_tokens)[::-1][k - 1]
    picked = np.argsort(-scores, kind="stable")[:k]
    return float(np.mean(true_tokens[picked] >= threshold))


def rank_metrics(true_tokens: np.ndarray, scores: np.ndarray) -> RankMetrics:
    true_tokens = np.asarray(true_tokens, float)
    scores = np.asarray(scores, float)
    r20, r10, r5 = (top_recall(true_tokens, scores, f) for f in TOP_FRACTIONS)
    if len(true_tokens) < 2:  # no pair to rank: NaN, without scipy's SmallSampleWarning
        return RankMetrics(r20, r10, r5, math.nan, math.nan, num_samples=len(true_tokens))
    with warnings.catch_warnings():  # constant lengths: NaN, reported as null (as_json)
        warnings.simplefilter("ignore", ConstantInputWarning)
        spearman = float(spearmanr(true_tokens, scores).statistic)
        kendall = float(kendalltau(true_tokens, scores).statistic)
    return RankMetrics(r20, r10, r5, spearman, kendall, num_samples=len(true_tokens))


def baseline_scores(trace: pd.DataFrame) -> np.ndarray:
    """The prompt-length-only baseline: longer prompt, longer answer."""
    return trace["prompt_tokens"].to_numpy(float)


def history_scores(train: pd.DataFrame, test: pd.DataFrame) -> np.ndarray:
    """The prompt-history predictor: each test row's prompt's median output length in
    ``train`` (0 for a prompt never seen): what a prompt's past alone says of its rank."""
    median = train.groupby("prompt_id")["output_tokens"].median()
    return test["prompt_id"].map(median).fillna(0.0).to_numpy(float)


def split_later_epoch(trace: pd.DataFrame, cut_iteration: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rows before ``cut_iteration`` (train) and from it on (test)."""
    before = trace["iteration"] < cut_iteration
    if before.all() or not before.any():
        raise ValueError(f"cut iteration {cut_iteration} leaves no train or no test rows")
    return trace[before].reset_index(drop=True), trace[~before].reset_index(drop=True)


def split_prompts(
    trace: pd.DataFrame, heldout_fraction: float = 0.2, seed: int = 0
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rows of the kept prompt ids (train) and of a random ``heldout_fraction`` (test)."""
    ids = np.unique(trace["prompt_id"].to_numpy())
    if len(ids) < 2:
        raise ValueError(
            f"held-out prompts: the trace has {len(ids)} prompt id(s), too few to hold some "
            "out and fit on the rest (at least 2 are needed)"
        )
    rng = np.random.default_rng(seed)
    heldout = rng.choice(ids, size=max(1, int(round(heldout_fraction * len(ids)))), replace=False)
    test = trace["prompt_id"].isin(heldout)
    return trace[~test].reset_index(drop=True), trace[test].reset_index(drop=True)


def score(ranker: RankerPredictor, test: pd.DataFrame, online: bool) -> dict[str, RankMetrics]:
    """Ranker and baseline metrics on ``test``; ``online``: its earlier iterations are history."""
    preds = ranker.predict_tokens(test, test if online else None)
    truth = test["output_tokens"].to_numpy(float)
    return {
        "ranker": rank_metrics(truth, preds),
        "baseline": rank_metrics(truth, baseline_scores(test)),
    }


def later_epoch_report(
    trace: pd.DataFrame, model: str, cut_iteration: int, spec: FeatureSpec | None = None
) -> dict[str, RankMetrics]:
    train, test = split_later_epoch(trace, cut_iteration)
    ranker = RankerPredictor(model, spec)
    ranker.fit_trace(train)
    truth = test["output_tokens"].to_numpy(float)
    return {
        **score(ranker, test, online=True),
        "history": rank_metrics(truth, history_scores(train, test)),
    }


def heldout_prompts_report(
    trace: pd.DataFrame, model: str, spec: FeatureSpec | None = None, seed: int = 0
) -> dict[str, RankMetrics]:
    train, test = split_prompts(trace, seed=seed)
    ranker = RankerPredictor(model, spec)
    ranker.fit_trace(train)
    return score(ranker, test, online=False)


def timings(trace: pd.DataFrame, model: str, num_rows: int = TIMING_ROWS) -> dict[str, float]:
    """Wall seconds to fit and to predict ``num_rows`` rows resampled from ``trace`` (with
    repeats where the trace is shorter); ``trace_rows``: the trace's own row count."""
    rows = trace.sample(n=num_rows, replace=len(trace) < num_rows, random_state=0)
    rows = rows.reset_index(drop=True)
    ranker = RankerPredictor(model)
    t0 = time.perf_counter()
    ranker.fit_trace(rows)
    t1 = time.perf_counter()
    ranker.predict_tokens(rows)
    t2 = time.perf_counter()
    return {"num_rows": num_rows, "trace_rows": len(trace), "fit_s": t1 - t0, "predict_s": t2 - t1}


def as_json(report: Any) -> Any:
    """A report with every :class:`RankMetrics` turned into a plain dict and every NaN
    into None (``null``): a rank correlation of constant lengths is undefined, and a bare
    ``NaN`` is not JSON."""
    if isinstance(report, RankMetrics):
        return as_json(asdict(report))
    if isinstance(report, dict):
        return {k: as_json(v) for k, v in report.items()}
    if isinstance(report, float) and math.isnan(report):
        return None
    return report
