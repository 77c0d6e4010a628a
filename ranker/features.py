"""Features known before generation, from a frame of requests and a table of observations.

A *request frame* has one row per request: ``prompt_id``, ``iteration``,
``prompt_tokens``, ``max_tokens`` and ``prompt`` (the text; ``None`` in the simulator).
An *observation table* adds ``output_tokens``: the completions seen so far.

Three blocks of features:

* **prompt shape**: log prompt tokens, log max tokens;
* **prompt text** (zero when there is no text): character, letter, digit and word
  counts, the integers written in the prompt (count, log of their sum and of the
  largest) — the quantities a task's answer length is usually parsed from — and the
  first character as a category (the task family of ``runtime.tasks``). The linear
  model also sees hashed character n-grams;
* **history**: the output lengths observed for the same prompt id (its earlier group
  siblings included) in iterations *strictly before* the request's own, so a sample
  never sees its own length nor a sibling generated alongside it: count, mean, max,
  min and latest log length, and the mean and latest *normal score* (probit of the
  length's percentile within its iteration, robust to a growing max length).
  ``NaN`` when the prompt has not been seen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.special import ndtri

FEATURE_VERSION = 1
REQUEST_COLUMNS = ["prompt_id", "iteration", "prompt_tokens", "max_tokens", "prompt"]
SHAPE_NAMES = ["log_prompt_tokens", "log_max_tokens"]
TEXT_NAMES = [
    "num_chars",
    "num_letters",
    "num_digits",
    "num_words",
    "num_ints",
    "log_sum_ints",
    "log_max_ints",
    "family",
]
HISTORY_NAMES = [
    "hist_count",
    "hist_mean_log",
    "hist_max_log",
    "hist_min_log",
    "hist_last_log",
    "hist_mean_score",
    "hist_last_score",
]
FEATURE_NAMES = SHAPE_NAMES + TEXT_NAMES + HISTORY_NAMES
FAMILY_INDEX = FEATURE_NAMES.index("family")
NUM_FAMILIES = 64  # first character's code modulo this; 0 means no text
_INT = re.compile(r"\d+")
_WORD = re.compile(r"[A-Za-z0-9]+")


@dataclass(slots=True, frozen=True)
class FeatureSpec:
    """What the features are; saved with a model so that a loaded one computes the same."""

    version: int = FEATURE_VERSION
    num_hash_features: int = 2**14  # width of the hashed character n-gram block (linear model)
    ngram_min: int = 1
    ngram_max: int = 3
    use_text: bool = True
    use_history: bool = True


def text_features(prompts: pd.Series) -> np.ndarray:
    """The text block, one row per prompt (zeros where the text is missing)."""
    return np.array([_one_text(p) for p in prompts], dtype=float).reshape(-1, len(TEXT_NAMES))


def _one_text(prompt: str | None) -> list[float]:
    if not prompt:
        return [0.0] * len(TEXT_NAMES)
    ints = [int(s) for s in _INT.findall(prompt)]
    return [
        float(len(prompt)),
        float(sum(c.isalpha() for c in prompt)),
        float(sum(c.isdigit() for c in prompt)),
        float(len(_WORD.findall(prompt))),
        float(len(ints)),
        float(np.log1p(sum(ints))),
        float(np.log1p(max(ints, default=0))),
        float(1 + ord(prompt.lstrip()[:1] or " ") % (NUM_FAMILIES - 1)),
    ]


def normal_scores(observations: pd.DataFrame) -> np.ndarray:
    """Probit of each observed length's mid-rank percentile within its iteration."""
    grouped = observations.groupby("iteration")["output_tokens"]
    rank = grouped.rank(method="average").to_numpy(float)
    count = grouped.transform("size").to_numpy(float)
    return ndtri((rank - 0.5) / count)


def history_features(observations: pd.DataFrame, requests: pd.DataFrame) -> np.ndarray:
    """The history block: per request, statistics of its prompt's earlier observations."""
    out = np.full((len(requests), len(HISTORY_NAMES)), np.nan)
    if observations.empty or requests.empty:
        return out
    per_iteration = _per_iteration(observations)
    queries = pd.DataFrame(
        {
            "row": np.arange(len(requests)),
            "prompt_id": requests["prompt_id"].to_numpy(np.int64),
            "iteration": requests["iteration"].to_numpy(np.int64),
        }
    ).sort_values("iteration", kind="stable")
    merged = pd.merge_asof(
        queries,
        per_iteration,
        on="iteration",
        by="prompt_id",
        allow_exact_matches=False,  # strictly earlier iterations only
        direction="backward",
    ).sort_values("row")
    return merged[HISTORY_NAMES].to_numpy(float)


def _per_iteration(observations: pd.DataFrame) -> pd.DataFrame:
    """Cumulative statistics per (prompt, iteration), sorted for ``merge_asof``."""
    obs = pd.DataFrame(
        {
            "prompt_id": observations["prompt_id"].to_numpy(np.int64),
            "iteration": observations["iteration"].to_numpy(np.int64),
            "log_len": np.log(np.maximum(observations["output_tokens"].to_numpy(float), 1.0)),
            "score": normal_scores(observations),
        }
    )
    per = (
        obs.groupby(["prompt_id", "iteration"])
        .agg(
            n=("log_len", "size"),
            s=("log_len", "sum"),
            mx=("log_len", "max"),
            mn=("log_len", "min"),
            zs=("score", "sum"),
        )
        .reset_index()
    )
    by_prompt = per.groupby("prompt_id")
    count = by_prompt["n"].cumsum()
    table = pd.DataFrame(
        {
            "prompt_id": per["prompt_id"],
            "iteration": per["iteration"],
            "hist_count": count,
            "hist_mean_log": by_prompt["s"].cumsum() / count,
            "hist_max_log": by_prompt["mx"].cummax(),
            "hist_min_log": by_prompt["mn"].cummin(),
            "hist_last_log": per["s"] / per["n"],
            "hist_mean_score": by_prompt["zs"].cumsum() / count,
            "hist_last_score": per["zs"] / per["n"],
        }
    )
    return table.sort_values("iteration", kind="stable").reset_index(drop=True)


def dense_features(
    requests: pd.DataFrame, observations: pd.DataFrame, spec: FeatureSpec
) -> np.ndarray:
    """All dense features (``FEATURE_NAMES`` order) of a request frame."""
    shape = np.column_stack(
        [
            np.log(np.maximum(requests["prompt_tokens"].to_numpy(float), 1.0)),
            np.log(np.maximum(requests["max_tokens"].to_numpy(float), 1.0)),
        ]
    )
    if spec.use_text:
        text = text_features(requests["prompt"])
    else:
        text = np.zeros((len(requests), len(TEXT_NAMES)))
    if spec.use_history:
        history = history_features(observations, requests)
    else:
        history = np.full((len(requests), len(HISTORY_NAMES)), np.nan)
    return np.hstack([shape, text, history])
