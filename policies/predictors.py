"""Output-length predictors behind the ``length_predictor`` seam.

``oracle`` knows each request's true length (simulator only), ``none`` knows nothing,
``noisy-oracle`` perturbs the true log-length with Gaussian noise whose scale is
calibrated so that the recall of the true longest 20 % equals a target (for what-ifs
such as "a ranker with StreamRL's published recall of 0.87").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from policies.protocols import LengthPredictor
from policies.records import Request
from policies.registry import Factories, Registry

TruthFn = Callable[[Request], int]

PREDICTORS: Factories[LengthPredictor] = Registry("length_predictor")


def top_recall(true_lengths: np.ndarray, scores: np.ndarray, fraction: float) -> float:
    """Share of the true longest ``fraction`` of samples found in the top ``fraction`` by score."""
    k = max(1, int(round(fraction * len(true_lengths))))
    true_top = set(np.argsort(-true_lengths, kind="stable")[:k].tolist())
    pred_top = set(np.argsort(-scores, kind="stable")[:k].tolist())
    return len(true_top & pred_top) / k


def _need_truth(truth: TruthFn | None, name: str) -> TruthFn:
    if truth is None:
        raise ValueError(
            f"length_predictor {name!r} needs the true output lengths, which only the "
            "simulator knows; use 'ranker' or 'none' in live runs"
        )
    return truth


@PREDICTORS.register("oracle")
class OraclePredictor:
    def __init__(self, truth: TruthFn | None = None) -> None:
        self._truth = _need_truth(truth, "oracle")

    def fit(self, requests: Sequence[Request], output_tokens: Sequence[int]) -> None:
        pass

    def predict(self, requests: Sequence[Request]) -> list[float | None]:
        return [float(self._truth(r)) for r in requests]


@PREDICTORS.register("none")
class NoPredictor:
    def fit(self, requests: Sequence[Request], output_tokens: Sequence[int]) -> None:
        pass

    def predict(self, requests: Sequence[Request]) -> list[float | None]:
        return [None for _ in requests]


def calibrate_noise(
    lengths: np.ndarray, target_recall: float, rng: np.random.Generator, fraction: float = 0.2
) -> float:
    """Noise scale (std of added log-noise) giving ``target_recall`` of the top ``fraction``."""
    log_len = np.log(np.maximum(lengths, 1.0))
    eps = rng.standard_normal(len(lengths))  # common random numbers: recall is monotone in sigma
    lo, hi = 0.0, 20.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if top_recall(lengths, log_len + mid * eps, fraction) > target_recall:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@PREDICTORS.register("noisy-oracle")
class NoisyOraclePredictor:
    def __init__(
        self,
        truth: TruthFn | None = None,
        target_recall: float = 0.87,
        rng: np.random.Generator | None = None,
        calibration_lengths: Sequence[int] | None = None,
    ) -> None:
        self._truth = _need_truth(truth, "noisy-oracle")
        self._rng = rng if rng is not None else np.random.default_rng(0)
        if not calibration_lengths:
            raise ValueError("noisy-oracle needs calibration_lengths from the workload")
        lengths = np.asarray(calibration_lengths, dtype=float)
        self.sigma = calibrate_noise(lengths, target_recall, self._rng)

    def fit(self, requests: Sequence[Request], output_tokens: Sequence[int]) -> None:
        pass

    def predict(self, requests: Sequence[Request]) -> list[float | None]:
        true = np.array([max(1, self._truth(r)) for r in requests], dtype=float)
        noise = self._rng.standard_normal(len(true)) * self.sigma
        return [float(x) for x in np.exp(np.log(true) + noise)]


@PREDICTORS.register("ranker")
def _ranker(ranker: LengthPredictor | None = None) -> LengthPredictor:
    """The learned output-length ranker (``ranker/``), built by the caller and passed in."""
    if ranker is None:
        raise ValueError(
            "length_predictor 'ranker' needs a fitted ranker: run through the tandem CLI, "
            "which loads policies.ranker_path or fits one on held-out draws of the workload "
            "(sim) or the run's completions (live)"
        )
    return ranker
