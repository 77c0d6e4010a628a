"""The regression models behind the ranker: both predict log output length.

* ``hgb`` — ``HistGradientBoostingRegressor`` (squared error on log length) over the dense
  features of :mod:`ranker.features`; missing history is ``NaN``, which the trees route
  natively, and the first character is a categorical feature.
* ``ridge`` — ``Ridge`` over the standardised dense features (missing history imputed
  as 0 plus a has-history indicator) and hashed character 1–3-grams of the prompt text.

Only the ranking of the predictions matters to dispatch and scheduling; the log target
makes ratios, not differences, count. docs/ranker.md compares the two; ``hgb`` wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.feature_extraction.text import HashingVectorizer
from sklearn.linear_model import Ridge
from threadpoolctl import threadpool_limits

from ranker.features import (
    FAMILY_INDEX,
    FEATURE_NAMES,
    HISTORY_NAMES,
    FeatureSpec,
    dense_features,
)

MODEL_NAMES = ("hgb", "ridge")
# OpenMP threads for the trees: on a shared, busy machine more threads than free cores
# make the fit ~10x slower (measured: 10k rows, 1.4 s on 1 thread, 13 s on 2 busy cores).
NUM_THREADS = 1
_HISTORY_SLICE = slice(len(FEATURE_NAMES) - len(HISTORY_NAMES), len(FEATURE_NAMES))


def log_target(output_tokens: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(np.asarray(output_tokens, float), 1.0))


class _Linear:
    """Ridge on standardised dense features and hashed character n-grams."""

    def __init__(self, spec: FeatureSpec) -> None:
        self._hasher = HashingVectorizer(
            analyzer="char",
            ngram_range=(spec.ngram_min, spec.ngram_max),
            n_features=spec.num_hash_features,
            alternate_sign=False,
            norm="l2",
        )
        self._ridge = Ridge(alpha=1.0)
        self._mean: np.ndarray | None = None
        self._std: np.ndarray | None = None

    def _design(self, dense: np.ndarray, prompts: pd.Series) -> sp.csr_matrix:
        has_history = ~np.isnan(dense[:, _HISTORY_SLICE.start])
        filled = np.where(np.isnan(dense), 0.0, dense)
        if self._mean is None:
            self._mean, self._std = filled.mean(axis=0), filled.std(axis=0) + 1e-9
        scaled = (filled - self._mean) / self._std
        text = self._hasher.transform(prompts.fillna("").astype(str))
        return sp.hstack([sp.csr_matrix(scaled), sp.csr_matrix(has_history[:, None]), text]).tocsr()

    def fit(self, dense: np.ndarray, prompts: pd.Series, y: np.ndarray) -> None:
        self._mean = None
        self._ridge.fit(self._design(dense, prompts), y)

    def predict(self, dense: np.ndarray, prompts: pd.Series) -> np.ndarray:
        return self._ridge.predict(self._design(dense, prompts))


class _Boosted:
    """Gradient-boosted trees on the dense features."""

    def __init__(self, spec: FeatureSpec) -> None:
        categorical = np.zeros(len(FEATURE_NAMES), dtype=bool)
        categorical[FAMILY_INDEX] = True
        self._trees = HistGradientBoostingRegressor(
            max_iter=200,
            learning_rate=0.1,
            max_leaf_nodes=31,
            min_samples_leaf=20,
            categorical_features=categorical,
            early_stopping=False,
            random_state=0,
        )

    def fit(self, dense: np.ndarray, prompts: pd.Series, y: np.ndarray) -> None:
        dense = np.where(np.isnan(dense).all(axis=0), 0.0, dense)  # e.g. no history yet
        with threadpool_limits(limits=NUM_THREADS, user_api="openmp"):
            self._trees.fit(dense, y)

    def predict(self, dense: np.ndarray, prompts: pd.Series) -> np.ndarray:
        with threadpool_limits(limits=NUM_THREADS, user_api="openmp"):
            return self._trees.predict(dense)


@dataclass(slots=True)
class FittedModel:
    """A trained estimator with what it was trained on (immutable once built)."""

    name: str
    spec: FeatureSpec
    estimator: Any
    num_train_rows: int
    max_train_iteration: int

    def predict_log(self, requests: pd.DataFrame, observations: pd.DataFrame) -> np.ndarray:
        dense = dense_features(requests, observations, self.spec)
        return self.estimator.predict(dense, requests["prompt"])


def train(name: str, spec: FeatureSpec, trace: pd.DataFrame) -> FittedModel:
    """Fit ``name`` on a trace; each row's history is the trace's earlier iterations."""
    if name not in MODEL_NAMES:
        raise ValueError(f"ranker model must be one of {', '.join(MODEL_NAMES)}, not {name!r}")
    if trace.empty:
        raise ValueError("cannot fit a ranker on an empty trace")
    estimator = _Boosted(spec) if name == "hgb" else _Linear(spec)
    dense = dense_features(trace, trace, spec)
    estimator.fit(dense, trace["prompt"], log_target(trace["output_tokens"].to_numpy()))
    return FittedModel(name, spec, estimator, len(trace), int(trace["iteration"].max()))
