"""The live check's parts that need no server: which configurations it runs, how it orders
them and counts agreeing pairs, the report, and the task trace it can search on."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from experiments.advise import Advice
from experiments.advise_eval import Evaluation
from experiments.advise_live import (
    LiveCheck,
    LivePlan,
    live_markdown,
    live_spec,
    picks,
    write_task_trace,
)
from experiments.advise_plan import SpaceOptions, plan_space
from experiments.advise_search import SearchResult
from policies.spec import load_spec
from tests.test_advise_space import small_spec

COST_MODEL = (
    Path(__file__).resolve().parents[1] / "docs" / "reports" / "fidelity-run14" / "cost-model"
)
SPACE = plan_space(small_spec(), SpaceOptions(axes=("dispatch=least-loaded", "predictor=oracle")))


def _advice(values: dict, best) -> Advice:
    evals = [Evaluation(c, 4, {"throughput_samples_per_s": v}, (), 0.0) for c, v in values.items()]
    result = SearchResult(
        list(SPACE.candidates), evals, best, values[best], 0, 0, True, 0.0, dict(values)
    )
    return Advice(SPACE, result, values.get(SPACE.input), best, values[best], [], evals,
                  "throughput", 60.0, 1.0)  # fmt: skip


def test_picks_the_top_distinct_values_and_the_input():
    others = [c for c in SPACE.candidates if c != SPACE.input][:6]
    values = {SPACE.input: 1.0, others[0]: 5.0, others[1]: 5.0, others[2]: 4.0,
              others[3]: 3.0, others[4]: 2.0, others[5]: 1.0}  # fmt: skip
    chosen = picks(_advice(values, others[1]), top=3)
    assert [v for _, _, v in chosen] == [5.0, 4.0, 3.0, 1.0]
    assert chosen[0][1] == others[1]  # of the tie at 5.0, the advice stands for both
    assert chosen[-1][1] == SPACE.input and chosen[-1][0].endswith("(input)")
    # others[5] ties the input: the input stands for it
    assert others[5] not in [c for _, c, _ in chosen]


def test_the_input_among_the_top_is_not_repeated():
    others = [c for c in SPACE.candidates if c != SPACE.input][:3]
    values = {SPACE.input: 4.5, others[0]: 5.0, others[1]: 4.0, others[2]: 3.0}
    chosen = picks(_advice(values, others[0]), top=3)
    assert [c for _, c, _ in chosen] == [others[0], SPACE.input, others[1]]


def test_orders_and_agreeing_pairs():
    check = LiveCheck(["a", "b", "c"], {"a": 3.0, "b": 2.0, "c": 1.0})
    check.live = {"a": [10.0, 9.0, 12.0], "b": [11.0, 8.0, 9.5], "c": [5.0, 6.0, 4.0]}
    check.twin = {"a": [3.0], "b": [2.5], "c": [1.0]}
    assert check.live_order() == ["a", "b", "c"]  # medians 10, 9.5, 5
    assert check.agrees()
    assert check.seed_orders() == [["b", "a", "c"], ["a", "b", "c"], ["a", "b", "c"]]
    assert check.pair_agreement(["b", "a", "c"]) == (2, 3)
    text = live_markdown(check)
    assert "agrees with the predicted order" in text and "(2/3 pairs as predicted)" in text
    assert "| a | 3 | 10 | 9–12 (30%)" in text


def test_disagreement_is_reported():
    check = LiveCheck(["a", "b"], {"a": 2.0, "b": 1.0})
    check.live = {"a": [1.0], "b": [2.0]}
    check.twin = {"a": [2.0], "b": [1.0]}
    assert not check.agrees()
    assert "differs from the predicted order (0/1 pairs" in check.summary()


def test_live_spec_pins_the_shared_server_and_the_paired_seed():
    spec = live_spec(small_spec(), SPACE.input, "http://127.0.0.1:1234", "tok", repeat=2)
    assert spec.run.seed == 2 and spec.live.server_urls == ["http://127.0.0.1:1234"]
    assert spec.live.token == "tok" and spec.live.checkpoint_every > spec.run.iterations


def test_bad_plan_is_an_error():
    with pytest.raises(ValueError, match="at least 1"):
        LivePlan(top=0)


def test_task_trace_is_a_trace_workload_the_sim_accepts(tmp_path):
    from experiments.specs import config_path
    from sim.simulator import Simulation

    spec = load_spec(config_path("live-tiny"), ["workload.num_prompts=64", "run.iterations=2"])
    path = write_task_trace(spec, tmp_path / "trace.parquet", num_epochs=2)
    trace = pd.read_parquet(path)
    assert set(trace["iteration"]) == {0, 1} and trace["output_tokens"].max() <= 128
    traced = load_spec(config_path("live-tiny"), [
        "workload.num_prompts=64", "run.iterations=2", "workload.kind=trace",
        f"workload.trace_path={path}", f"sim.cost_model=profiled:{COST_MODEL}",
    ])  # fmt: skip
    assert (
        Simulation(traced).run().metrics["num_samples_trained"] == 2 * traced.algorithm.batch_size
    )
