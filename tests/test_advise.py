"""``tandem advise`` end to end on a small spec with the real simulator: the files it writes,
``best.yaml`` running unchanged, the Pareto front, what each change buys, the budget."""

from __future__ import annotations

import time
from dataclasses import replace

import pandas as pd
import pytest
import yaml

from experiments.advise import AdviseOptions, Unpriced, _attribute, advise, swap
from experiments.advise_eval import PoolEvaluator, run_candidate
from experiments.advise_plan import SpaceOptions
from experiments.advise_report import pareto_front, write_advice
from experiments.advise_space import candidate_spec
from experiments.cli import main
from policies.spec import load_spec
from sim.simulator import Simulation
from tests.test_advise_space import small_spec

AXES = ("dispatch=least-loaded,skewness-aware", "predictor=oracle", "max_num_seqs=32")


@pytest.fixture(scope="module")
def advice():
    options = AdviseOptions(SpaceOptions(axes=AXES), budget_s=120.0, workers=1)
    return advise(small_spec(), options)


def test_the_advice_beats_or_equals_the_input_and_comes_from_full_runs(advice):
    assert advice.input_value is not None
    assert advice.best_value >= advice.input_value
    assert advice.result.finished and advice.result.coverage == 1.0
    full = advice.space.base.run.iterations
    again = run_candidate(advice.space.base, advice.best, full)  # deterministic: same figure
    assert again.metrics["throughput_samples_per_s"] == advice.best_value
    assert advice.result.num_short + advice.result.num_full < 2 * len(advice.space.candidates)


def test_every_change_is_priced_from_both_ends(advice):
    dims = {c.dimension for c in advice.changes}
    assert dims, "the small spec's input is not its best configuration"
    base, full = advice.space.base, advice.space.base.run.iterations
    for change in advice.changes:
        alone = swap(advice.space.input, advice.best, change.dimension)
        if change.alone is not None:
            assert (
                run_candidate(base, alone, full).metrics["throughput_samples_per_s"] == change.alone
            )
        reverted = swap(advice.best, advice.space.input, change.dimension)
        if change.reverted is not None:
            assert (
                run_candidate(base, reverted, full).metrics["throughput_samples_per_s"]
                == change.reverted
            )


def test_written_files_and_best_yaml_runs_unchanged(advice, tmp_path):
    out = write_advice(advice, tmp_path / "advice")
    for name in (
        "best.yaml",
        "input.yaml",
        "pareto.csv",
        "pareto.png",
        "advice.md",
        "evaluations.csv",
    ):
        assert (out / name).stat().st_size > 0, name
    best = load_spec(out / "best.yaml")
    assert best == advice.best_spec
    assert yaml.safe_load((out / "input.yaml").read_text())["pipeline"]["mode"] == "stream-async"
    short = best.model_copy(update={"run": best.run.model_copy(update={"iterations": 2})})
    assert Simulation(short).run().metrics["num_samples_trained"] == 2 * best.algorithm.batch_size
    text = (out / "advice.md").read_text()
    assert f"{advice.best_value:.4g}" in text and f"{advice.input_value:.4g}" in text
    for change in advice.changes:
        assert f"| {change.dimension} | {change.before} | {change.after} |" in text


def test_changes_the_budget_left_unpriced_say_why_and_the_top_says_so(advice, tmp_path):
    """Seen: with ``--budget-s 10`` every cell of "What each change buys" read ``— (—)``
    under a legend of two reasons, and nothing said the explanation was incomplete."""
    unpriced = [
        replace(c, alone=None, reverted=None, alone_why=Unpriced.NO_BUDGET,
                reverted_why=Unpriced.NOT_RUNNABLE)
        for c in advice.changes
    ]  # fmt: skip
    text = (write_advice(replace(advice, changes=unpriced), tmp_path) / "advice.md").read_text()
    top = text.split("## What each change buys")[0]
    n = len(unpriced)
    assert f"the budget (120 s) ran out before {n} of the {2 * n} full runs" in top
    assert "`--budget-s 480`" in top
    for c in unpriced:
        cells = "— (not measured: the budget ran out) | — (not runnable that way) |"
        assert f"| {c.dimension} | {c.before} | {c.after} | {cells}" in text
    assert (
        "ran out before" not in (write_advice(advice, tmp_path / "full") / "advice.md").read_text()
    )


class _NoRuns:
    workers = 1

    def submit(self, c, iterations):  # noqa: ANN001, ANN201 - the Evaluator protocol
        raise AssertionError("past the deadline nothing is run")


def test_pricing_past_the_deadline_says_which_ends_were_not_measured(advice):
    past = time.monotonic() - 1.0
    changes = _attribute(advice.space, advice.best, [], _NoRuns(), advice.objective, past)
    assert [c.dimension for c in changes] == [c.dimension for c in advice.changes]
    for c in changes:
        for end, source, target in (("alone", advice.space.input, advice.best),
                                    ("reverted", advice.best, advice.space.input)):  # fmt: skip
            try:
                candidate_spec(advice.space.base, swap(source, target, c.dimension))
                expected = Unpriced.NO_BUDGET
            except ValueError:
                expected = Unpriced.NOT_RUNNABLE
            assert (getattr(c, end), getattr(c, f"{end}_why")) == (None, expected)


def test_pareto_front_is_the_non_dominated_full_runs(advice, tmp_path):
    out = write_advice(advice, tmp_path / "advice")
    front = pd.read_csv(out / "pareto.csv")
    runs = pd.read_csv(out / "evaluations.csv")
    full = runs[(runs["kind"] == "full") & runs["error"].isna()]
    assert front["throughput_samples_per_s"].max() == pytest.approx(
        full["throughput_samples_per_s"].max()
    )
    assert {"throughput_samples_per_s", "cost_normalized_throughput", "staleness_bound", "gpus",
            "mode", "tp", "placement", "dispatch"} <= set(front.columns)  # fmt: skip
    for _, row in front.iterrows():  # nothing in the runs beats a front point on every axis
        beats = (
            (full["throughput_samples_per_s"] >= row["throughput_samples_per_s"])
            & (full["staleness_bound"] <= row["staleness_bound"])
            & (full["gpus"] <= row["gpus"])
            & (full["throughput_samples_per_s"] > row["throughput_samples_per_s"])
        )
        assert not beats.any()


def test_pareto_front_keeps_a_less_stale_but_slower_point():
    frame = pd.DataFrame({
        "throughput_samples_per_s": [5.0, 4.0, 3.0], "cost_normalized_throughput": [0.5, 0.4, 0.3],
        "staleness_bound": [1, 0, 0], "max_staleness": [1, 0, 0], "gpus": [16, 16, 16],
        "mode": ["a", "b", "c"], "lag": [None] * 3, "tp": [1] * 3, "placement": ["p"] * 3,
        "max_num_seqs": [8] * 3, "dispatch": ["d"] * 3, "scheduling": ["s"] * 3,
        "predictor": ["o"] * 3, "trainer_gpus": [8] * 3, "generation_gpus": ["8"] * 3,
        "is_input": [False] * 3, "is_best": [True, False, False],
    })  # fmt: skip
    assert list(pareto_front(frame)["mode"]) == ["a", "b"]


class _SlowEvaluator(PoolEvaluator):
    """Every simulation takes at least half a second, so a 2 s budget cannot cover the
    space on any machine (a fast one nearly finished it in 2 s of real runs)."""

    def submit(self, c, iterations):  # noqa: ANN001, ANN201 - the Evaluator protocol
        start = time.monotonic()
        future = super().submit(c, iterations)
        time.sleep(max(0.0, 0.5 - (time.monotonic() - start)))
        return future


def test_a_small_budget_returns_the_best_found_and_says_so(tmp_path):
    options = AdviseOptions(SpaceOptions(), budget_s=2.0, workers=1)  # every axis: ~3800 points
    out = advise(small_spec(), options, evaluator=_SlowEvaluator(small_spec(), 1))
    assert out.best_value >= (out.input_value or 0.0)
    assert not out.result.finished
    assert out.result.num_open > 0 and out.result.coverage < 1.0
    text = (write_advice(out, tmp_path) / "advice.md").read_text()
    assert "the budget (2 s) stopped it" in text and "not covered" in text
    # the best may be missing: said where the coverage could read as near-complete
    assert f"a better candidate may be among the {out.result.num_open} not covered" in text


def test_cli_advise_writes_the_outputs_and_rejects_bad_input(tmp_path, capsys):
    spec_path = tmp_path / "small.yaml"
    spec_path.write_text(small_spec().to_yaml())
    out = tmp_path / "out"
    args = ["advise", str(spec_path), "--out", str(out), "--budget-s", "60", "--workers", "1",
            "--axis", "mode=stream-async,pipeline", "--axis", "tp=1,2"]  # fmt: skip
    assert main([*args, *sum((["--axis", a] for a in AXES), [])]) == 0
    assert "advice:" in capsys.readouterr().out
    assert (out / "best.yaml").exists()
    assert (
        main(
            [
                "run",
                str(out / "best.yaml"),
                "--out",
                str(tmp_path / "run"),
                "--set",
                "run.iterations=2",
            ]
        )
        == 0
    )
    assert main(["advise", str(spec_path), "--out", str(out), "--axis", "colour=red"]) == 2
    assert "unknown axis 'colour'" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:  # refused by the parser (experiments/arg_types)
        main(["advise", str(spec_path), "--out", str(out), "--budget-s", "0"])
    assert stop.value.code == 2
    with pytest.raises(SystemExit):
        main(["advise", str(spec_path), "--out", str(out), "--objective", "latency"])


def test_advise_refuses_what_it_cannot_do_before_searching(tmp_path, capsys, monkeypatch):
    """Seen: ``--live-check`` without a calibrated cost model refused only after the whole
    search; ``advise live-tiny`` hinted at an ``--live`` flag advise does not have."""
    import experiments.advise

    out = str(tmp_path / "out")
    assert main(["advise", "live-tiny", "--out", out]) == 2
    said = " ".join(capsys.readouterr().out.split())
    assert "sim.cost_model=profiled:DIR" in said and "add --live" not in said

    def searched(*args, **kwargs):
        raise AssertionError("the search ran")

    monkeypatch.setattr(experiments.advise, "advise", searched)
    assert main(["advise", "streamrl-7b", "--live-check", "2", "--out", out]) == 2
    assert "set sim.cost_model=profiled:DIR" in " ".join(capsys.readouterr().out.split())


def test_advice_at_tp_above_1_says_how_tp_communication_is_priced(advice):
    """Seen: advise picked tp 8 (and tp 16 across two nodes) for an 8B model without a word
    that the simulator priced no tensor-parallel all-reduce; now it prices one, as a lower
    bound, and says so."""
    from dataclasses import replace

    from experiments.advise_report import advice_markdown, evaluations_frame, full_runs

    def text(tp: int) -> str:
        best = replace(advice.best, structure=replace(advice.best.structure, tp=tp))
        return advice_markdown(replace(advice, best=best), full_runs(evaluations_frame(advice)))

    assert "prices its tensor-parallel communication" in text(4)
    assert "as a lower bound" in text(4)
    assert "tensor-parallel communication" not in text(1)


def test_advice_lists_what_tandem_run_would_warn_of_its_spec(advice, monkeypatch):
    """The search's own runs keep their warnings to themselves (a tp-16 axis printed one per
    candidate); the advised spec's are in advice.md, as ``tandem run best.yaml`` gives them."""
    from experiments.advise_report import advice_markdown, evaluations_frame, full_runs

    checked = []

    def check(spec):
        checked.append(spec)
        return ["cluster.generation.0.tp: 16 spans more than one 8-GPU machine"]

    monkeypatch.setattr("sim.cluster.check_sim_run", check)
    text = advice_markdown(advice, full_runs(evaluations_frame(advice)))
    assert "- cluster.generation.0.tp: 16 spans more than one 8-GPU machine" in text
    assert checked == [advice.best_spec]
