"""The search on synthetic values (no simulator): with estimates that bound the values it
finds the best exactly, runs fewer simulations than the space holds, survives failing
candidates, and stops at its deadline saying what it did not cover."""

from __future__ import annotations

import math
import time
from concurrent.futures import Future

from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.advise_eval import Evaluation
from experiments.advise_plan import SpaceOptions, plan_space
from experiments.advise_search import SearchConfig, SearchState, search
from experiments.advise_space import Candidate
from tests.test_advise_space import small_spec

FULL = 4
SPACE = plan_space(
    small_spec(), SpaceOptions(axes=("dispatch=least-loaded,round-robin", "predictor=oracle"))
)


class FakeEvaluator:
    """Answers with given values: a short run sees ``short_ratio`` of the full value."""

    workers = 2

    def __init__(
        self, values: dict[Candidate, float], short_ratio: float = 0.97, fail: set | None = None
    ):
        self.values = values
        self.short_ratio = short_ratio
        self.fail = fail or set()
        self.calls: list[tuple[Candidate, int]] = []

    def submit(self, c: Candidate, iterations: int) -> Future[Evaluation]:
        self.calls.append((c, iterations))
        value = self.values[c] * (1.0 if iterations >= FULL else self.short_ratio)
        metrics = {"throughput_samples_per_s": value, "num_samples_trained": 64.0 * iterations}
        error = "ValueError: boom" if c in self.fail else None
        future: Future[Evaluation] = Future()
        # no step ends: a short run reports its own throughput (as pipeline mode does)
        future.set_result(Evaluation(c, iterations, {} if error else metrics, (), 0.01, error))
        return future


def _config(deadline_s: float = math.inf) -> SearchConfig:
    return SearchConfig(
        "throughput", FULL, time.monotonic() + deadline_s if deadline_s != math.inf else math.inf
    )


def _values(seed: int, slack: float) -> tuple[dict[Candidate, float], list[float]]:
    """Values at most their estimates; the estimate overshoots by up to ``slack``."""
    import random

    rng = random.Random(seed)
    values, estimates = {}, []
    for c in SPACE.candidates:
        estimate = 1.0 + rng.random()
        values[c] = estimate / (1.0 + slack * rng.random())
        estimates.append(estimate)
    return values, estimates


def test_finds_the_exact_best_with_fewer_simulations_than_the_space():
    values, estimates = _values(seed=1, slack=0.3)
    evaluator = FakeEvaluator(values)
    result = search(SearchState(SPACE.candidates, estimates), evaluator, _config())
    true_best = max(values, key=values.__getitem__)
    assert result.finished and result.best == true_best
    assert result.best_value == values[true_best]
    assert len(evaluator.calls) < len(SPACE.candidates) / 2
    assert result.coverage == 1.0 and result.num_open == 0
    # only full runs are ever reported
    assert set(result.full_values) == {c for c, it in evaluator.calls if it == FULL}


def _separable_values(seed: int, slack: float) -> tuple[dict[Candidate, float], list[float]]:
    """Values that follow the search's model, ``log(value / estimate) = s[structure] +
    b[policy]``, each factor at most 1 (so the estimates bound the values)."""
    import random

    rng = random.Random(seed)
    structure = {c.structure: 1.0 / (1.0 + slack * rng.random()) for c in SPACE.candidates}
    policy = {c.policies.key: 1.0 / (1.0 + slack * rng.random()) for c in SPACE.candidates}
    values, estimates = {}, []
    for c in SPACE.candidates:
        estimate = 1.0 + rng.random()
        values[c] = estimate * structure[c.structure] * policy[c.policies.key]
        estimates.append(estimate)
    return values, estimates


@settings(max_examples=10)
@given(seed=st.integers(0, 10_000), slack=st.floats(0.0, 1.0), ratio=st.floats(0.8, 1.0))
def test_with_bounding_estimates_and_the_models_form_the_best_is_never_missed(seed, slack, ratio):
    """Where the values have the form the search fits (a structure's factor times a
    policy's) and the estimates bound them, pruning never loses the best."""
    values, estimates = _separable_values(seed, slack)
    result = search(
        SearchState(SPACE.candidates, estimates), FakeEvaluator(values, ratio), _config()
    )
    assert result.finished
    assert result.best_value == max(values.values())


def test_the_first_candidates_run_in_full_first():
    values, estimates = _values(seed=2, slack=0.2)
    worst = min(values, key=values.__getitem__)
    evaluator = FakeEvaluator(values)
    config = SearchConfig("throughput", FULL, math.inf, first=(worst,))
    search(SearchState(SPACE.candidates, estimates), evaluator, config)
    assert evaluator.calls[0] == (worst, FULL)


def test_failing_candidates_are_skipped_not_fatal():
    values, estimates = _values(seed=3, slack=0.2)
    ranked = sorted(values, key=values.__getitem__, reverse=True)
    evaluator = FakeEvaluator(values, fail={ranked[0]})
    result = search(SearchState(SPACE.candidates, estimates), evaluator, _config())
    assert result.best == ranked[1]
    assert any(c == ranked[0] for c, _ in evaluator.calls)


def test_a_spent_budget_returns_what_it_has_and_says_what_is_not_covered():
    values, estimates = _values(seed=4, slack=0.2)
    result = search(SearchState(SPACE.candidates, estimates), FakeEvaluator(values), _config(-1.0))
    assert not result.finished and result.best is None and not result.evaluations
    assert result.num_open == len(SPACE.candidates) and result.coverage == 0.0


def test_estimates_that_overshoot_some_modes_are_learned():
    """Estimates 3x too optimistic for one mode: the search still finds the best but spends
    short runs there until the model learns it (no bound is assumed beyond what it saw)."""
    values, estimates = _values(seed=5, slack=0.1)
    pipeline = [i for i, c in enumerate(SPACE.candidates) if c.structure.mode == "pipeline"]
    for i in pipeline:
        estimates[i] *= 3.0
    result = search(SearchState(SPACE.candidates, estimates), FakeEvaluator(values), _config())
    assert result.best_value == max(values.values())
