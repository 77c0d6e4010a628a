"""``--axis`` bounds the advice: the runs that price a change carry the input's values, and
one outside the space is shown (``in_space`` false) but never chosen. Seen: ``--axis
tp=1,3`` on a tp-2 input advised tp 2, the input with only its mode changed."""

from __future__ import annotations

from concurrent.futures import Future

import pandas as pd
import yaml

from experiments.advise import AdviseOptions, advise
from experiments.advise_eval import METRIC_KEYS, Evaluation
from experiments.advise_live import picks
from experiments.advise_plan import SpaceOptions, plan_space
from experiments.advise_report import write_advice
from experiments.advise_space import Candidate
from tests.test_advise import AXES
from tests.test_advise_space import small_spec


class _TpOneWins:
    """Every figure made up: a tp-1 run (the input's tp) beats every other."""

    workers = 1

    def submit(self, c: Candidate, iterations: int) -> Future[Evaluation]:
        s = c.structure
        value = (10.0 if s.tp == 1 else 1.0) + 0.01 * (s.mode == "pipeline") + 1e-4 * s.trainer_gpus
        metrics: dict[str, float | None] = dict.fromkeys(METRIC_KEYS, 1.0)
        metrics.update(throughput_samples_per_s=value, cost_normalized_throughput=value / 8)
        future: Future[Evaluation] = Future()
        future.set_result(Evaluation(c, iterations, metrics, (), 0.001))
        return future


def test_the_advice_and_the_pareto_set_stay_inside_the_axis(tmp_path):
    axes = (*AXES, "mode=stream-async,pipeline", "tp=2")
    options = AdviseOptions(SpaceOptions(axes=axes), budget_s=60.0, workers=1)
    advice = advise(small_spec(), options, evaluator=_TpOneWins())
    assert advice.best.structure.tp == 2
    assert advice.space.input_outside  # the input runs tp 1
    out = write_advice(advice, tmp_path)
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert {p["tp"] for p in best["cluster"]["generation"]} == {2}
    assert set(pd.read_csv(out / "pareto.csv")["tp"]) == {2}
    runs = pd.read_csv(out / "evaluations.csv")
    priced_outside = runs[(runs["tp"] == 1) & ~runs["is_input"]]
    assert not priced_outside.empty and not priced_outside["in_space"].any()
    assert runs.loc[runs["tp"] == 2, "in_space"].all()
    text = (out / "advice.md").read_text()
    assert "value no `--axis` lists" in text and "`in_space` false" in text
    live = [c for _, c, _ in picks(advice, top=10)]  # what --live-check would run
    assert all(c.structure.tp == 2 for c in live if c != advice.space.input)


def test_every_candidate_is_inside_its_own_bounds():
    space = plan_space(small_spec(), SpaceOptions(axes=(*AXES, "scheduling=lpt", "tp=1,2")))
    assert not space.input_outside
    assert all(space.bounds.admits(c) for c in space.candidates)
