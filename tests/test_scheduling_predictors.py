"""Scheduling priorities (fcfs, lpt) and length predictors (oracle, none, noisy-oracle)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import request

from policies.predictors import (
    PREDICTORS,
    NoisyOraclePredictor,
    NoPredictor,
    OraclePredictor,
    calibrate_noise,
    top_recall,
)
from policies.scheduling import SCHEDULING, FcfsScheduling, LptScheduling


def _admission_order(policy, requests) -> list[int]:
    """Requests sorted by priority, ties in arrival order (as the engine's heap does)."""
    keyed = sorted(enumerate(requests), key=lambda e: (policy.priority(e[1]), e[0]))
    return [r.sample_id for _, r in keyed]


def test_scheduling_registry():
    assert {"fcfs", "lpt"} <= set(SCHEDULING.names())
    assert isinstance(SCHEDULING.create("lpt"), LptScheduling)
    with pytest.raises(ValueError, match="already registered"):
        SCHEDULING.register("fcfs")(FcfsScheduling)
    with pytest.raises(ValueError, match="unknown scheduling policy 'sjf'"):
        SCHEDULING.create("sjf")


def test_fcfs_keeps_arrival_order():
    reqs = [request(0, 5.0), request(1, 50.0), request(2, None), request(3, 20.0)]
    assert [FcfsScheduling().priority(r) for r in reqs] == [0.0, 0.0, 0.0, 0.0]
    assert _admission_order(FcfsScheduling(), reqs) == [0, 1, 2, 3]


def test_lpt_longest_predicted_first_unknown_last_in_order():
    reqs = [request(0, 5.0), request(1, None), request(2, 50.0), request(3, 20.0), request(4)]
    assert [LptScheduling().priority(r) for r in reqs] == [-5.0, 0.0, -50.0, -20.0, 0.0]
    assert _admission_order(LptScheduling(), reqs) == [2, 3, 0, 1, 4]


def test_lpt_serves_an_older_batch_first_longest_first_within_it():
    # batches overlap on an instance in ``pipeline`` mode: the next optimizer step needs
    # the oldest; a prediction above max_tokens (noisy, ranker) jumps no batch
    reqs = [
        request(0, 900.0, iteration=2),
        request(1, 5.0, iteration=1),
        request(2, 10**9, iteration=2, max_tokens=1000),
        request(3, 50.0, iteration=1),
        request(4, None, iteration=1),
        request(5, 20.0, iteration=1),
    ]
    assert _admission_order(LptScheduling(), reqs) == [3, 5, 1, 4, 2, 0]


# -- predictors --------------------------------------------------------------------------------


def test_predictor_registry():
    assert {"noisy-oracle", "none", "oracle", "ranker"} <= set(PREDICTORS.names())
    with pytest.raises(ValueError, match="already registered"):
        PREDICTORS.register("oracle")(OraclePredictor)


def test_oracle_predicts_the_truth_and_none_predicts_nothing():
    truth = {0: 7, 1: 300, 2: 1}
    reqs = [request(i) for i in range(3)]
    oracle = PREDICTORS.create("oracle", truth=lambda r: truth[r.sample_id])
    assert oracle.predict(reqs) == [7.0, 300.0, 1.0]
    assert NoPredictor().predict(reqs) == [None, None, None]
    assert PREDICTORS.create("none").predict(reqs[:1]) == [None]


def test_oracle_needs_the_truth():
    with pytest.raises(ValueError, match="true output lengths"):
        PREDICTORS.create("oracle")
    with pytest.raises(ValueError, match="true output lengths"):
        PREDICTORS.create("noisy-oracle", calibration_lengths=[1, 2, 3])
    with pytest.raises(ValueError, match="calibration_lengths"):
        PREDICTORS.create("noisy-oracle", truth=lambda r: 1)
    with pytest.raises(ValueError, match="fitted ranker"):
        PREDICTORS.create("ranker")


def test_top_recall_hand_example():
    true = np.array([10, 50, 20, 40, 30, 1, 2, 3, 4, 5], float)
    # top 20 % (2 samples) by truth: indices 1 and 3
    assert top_recall(true, true, 0.2) == 1.0
    assert top_recall(true, np.array([0, 9, 0, 0, 8, 0, 0, 0, 0, 0], float), 0.2) == 0.5
    assert top_recall(true, -true, 0.2) == 0.0


def test_calibrate_noise_is_zero_for_perfect_recall_and_grows_as_recall_drops():
    lengths = np.random.default_rng(0).lognormal(7, 1, size=5000)
    sigmas = [calibrate_noise(lengths, r, np.random.default_rng(1)) for r in (0.95, 0.8, 0.5)]
    assert 0 < sigmas[0] < sigmas[1] < sigmas[2]


@pytest.mark.parametrize("target", [0.5, 0.87, 0.95])
def test_noisy_oracle_recall_is_close_to_target(target):
    rng = np.random.default_rng(42)
    calibration = rng.lognormal(7, 1, size=20000).round().astype(int) + 1
    fresh = rng.lognormal(7, 1, size=20000).round().astype(int) + 1
    truth = dict(enumerate(fresh.tolist()))
    predictor = NoisyOraclePredictor(
        truth=lambda r: truth[r.sample_id],
        target_recall=target,
        rng=np.random.default_rng(5),
        calibration_lengths=calibration.tolist(),
    )
    preds = predictor.predict([request(i) for i in range(len(fresh))])
    recall = top_recall(fresh.astype(float), np.asarray(preds, float), 0.2)
    assert abs(recall - target) < 0.02


def test_noisy_oracle_is_reproducible_from_its_stream():
    cal = list(range(1, 2001))
    reqs = [request(i) for i in range(50)]

    def make():
        return NoisyOraclePredictor(
            truth=lambda r: r.sample_id + 1,
            rng=np.random.default_rng(9),
            calibration_lengths=cal,
        )

    assert make().predict(reqs) == make().predict(reqs)
    assert make().predict(reqs) != OraclePredictor(truth=lambda r: r.sample_id + 1).predict(reqs)
